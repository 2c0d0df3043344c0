//! CapsuleDB's messages on the fabric: a worker's read request for a key its memtable cannot
//! answer, CapsuleDB's answer, and CapsuleDB's frontier (what workers may evict). They share
//! the prefix of [`crate::wire`] (`u8 version | u8 type | [32] capsule`) with types 5 to 7,
//! which [`crate::Msg::decode`] refuses as unknown types; [`is_db_msg`] tells them apart.
//!
//! ```text
//!   type 5, get:     u64 req_id | [16] salt | u32 len | sealed key
//!   type 6, answer:  u32 signer | u64 index_seq | u16 n | n × u64 req_id | [16] salt | u32 len
//!                    | sealed body | [64] sig
//!   type 7, heads:   u32 signer | u64 seq | u16 n | n × (u32 writer | u64 lamport) | [64] sig
//!   type 8, scan:    u64 req_id | [16] salt | u32 len | sealed query
//!   type 9, scan answer: u32 signer | u64 index_seq | u64 req_id | [16] salt | u32 len
//!                    | sealed body | [64] sig
//!   answer body v2 (plaintext): u16 nrec (0..=256) | nrec × (u32 rlen (1..=ANSWER_RECORD_BYTES_MAX)
//!                            | record) | u16 n (1..=256) | n × (u16 klen | key | u8 tag (0 miss,
//!                            1 tombstone, 2 value) | tag > 0: u64 lamport | u32 writer
//!                            | u16 rec (< nrec))
//!   scan query (plaintext):  u16 limit (1..=SCAN_LIMIT_MAX) | u16 plen | prefix
//!                            | u8 has_after | has_after: u16 alen | after
//!   scan body v2 (plaintext): u8 more | u16 nrec (0..=SCAN_LIMIT_MAX) | nrec × (u32 rlen | record)
//!                            | u16 n (0..=limit) | n × (u16 klen | key | u8 tag (1 tombstone,
//!                            2 value) | u64 lamport | u32 writer | u16 rec (< nrec)), keys
//!                            strictly increasing
//! ```
//!
//! **Answers carry their proof.** Every version an answer or a scan answer names comes with the
//! signed data record that wrote it (`rec` indexes the body's record list; a record that wrote
//! several answered keys is carried once). The value is not repeated: it is the op's. A front
//! end checks each with its own verifier ([`RecordCheck`]: the writer's signature, certificate,
//! revocations, key generation, the capsule, the AEAD), finds the op of the asked key with the
//! answered Lamport time, and checks the record's writer and the op's kind (put or delete)
//! against the answer. CapsuleDB's signature then only vouches for *which* version is the
//! newest it holds (and the index it read at); a stolen CapsuleDB key can withhold (answer a
//! miss, or an older version that some writer really wrote), but it can no longer make up a
//! version or a value, nor revive a revoked writer's writes. A data record signed by
//! CapsuleDB's own key proves nothing (CapsuleDB writes no data). Version 2 of the bodies is
//! bound by the signature domains and sealing contexts (`…-v2`): a version-1 answer never
//! verifies.
//!
//! A scan asks for the first `limit` keys that start with `prefix` and sort above `after`
//! (tombstones included: a worker needs them to know a key it still holds is deleted). The
//! answer holds those keys' newest versions in key order and says whether more follow
//! (`more`); CapsuleDB stops early, with `more` set, once the body would pass
//! [`SCAN_BODY_BYTES_MAX`] (always after at least one entry).
//!
//! Keys and values are secret: the key of a get and the body of an answer are sealed with the
//! application's data key (AES-256-GCM under a key derived from a random salt, as records are;
//! the bytes before the salt are the associated data). The fabric is untrusted, so answers and
//! heads are also signed with CapsuleDB's writer key (ECDSA over SHA-256 of a domain tag and
//! every byte before the signature): a worker holding the data key cannot forge an answer, and
//! nobody can forge a frontier that would make workers evict what CapsuleDB does not hold.
//! A get is unsigned: it is a request, like a repair request, and costs CapsuleDB one lookup.
//! An answer names the request ids it answers; a worker applies it only for a request of its
//! own that is still pending for that key, so replaying an old answer achieves nothing. The
//! answer also names the index CapsuleDB had when it answered (`index_seq`); heads carry the
//! index their frontier is stored in (`seq`). A worker refuses an answer older than the heads
//! under which it last evicted from the key's shard: such an answer (delayed in the network)
//! may not know the version the worker evicted (see `Memtable::learn`).

use crate::memtable::Version;
use psl_capsule::{Action, Body, CapsuleName, Op, Record, Verifier};
use psl_crypto::{sha256, DataKey, Hash256, Signature, SigningKey, VerifyingKey, SALT_LEN};

const TYPE_GET: u8 = 5;
const TYPE_ANSWER: u8 = 6;
const TYPE_HEADS: u8 = 7;
const TYPE_SCAN: u8 = 8;
const TYPE_SCAN_ANSWER: u8 = 9;
const PREFIX_LEN: usize = 34;
/// Most request ids one answer names.
pub const ANSWER_REQS_MAX: usize = 256;
/// Most writers in one heads message.
pub const DB_HEADS_MAX: usize = 4096;
/// Most bytes of a sealed key or answer body (a 1 MiB value, a key, the framing, the tag).
pub const SEALED_BYTES_MAX: usize = (1 << 20) + 1024;
const KEY_BYTES_MAX: usize = 1024;
/// Most keys one scan asks for.
pub const SCAN_LIMIT_MAX: usize = 1024;
/// A scan answer's body stops growing past this many bytes (one entry always fits).
pub const SCAN_BODY_BYTES_MAX: usize = 4 << 20;
/// Most bytes of one record an answer carries (a capsule's own `record_bytes_max` may be lower:
/// the front end decodes the record under its capsule's limits).
pub const ANSWER_RECORD_BYTES_MAX: usize = 12 << 20;
/// An answer's body stops growing past this many bytes (one entry with its record always fits).
pub const ANSWER_BODY_BYTES_MAX: usize = 1 << 20;
/// Most bytes of a sealed answer or scan answer body: one entry with the largest record, under
/// the fabric's 16 MiB frames.
pub const ANSWER_SEALED_BYTES_MAX: usize = 15 << 20;
/// Most bytes of a sealed scan answer body.
pub const SCAN_SEALED_BYTES_MAX: usize = ANSWER_SEALED_BYTES_MAX;
const GET_CONTEXT: &[u8] = b"psl/db-get/v1";
const SCAN_CONTEXT: &[u8] = b"psl/db-scan/v1";
const SCAN_ANSWER_CONTEXT: &[u8] = b"psl/db-scan-answer/v2";
const SCAN_ANSWER_DOMAIN: &[u8] = b"psl-db-scan-answer-v2";
const ANSWER_CONTEXT: &[u8] = b"psl/db-answer/v2";
const ANSWER_DOMAIN: &[u8] = b"psl-db-answer-v2";
const HEADS_DOMAIN: &[u8] = b"psl-db-heads-v1";

/// A worker's read request for one key (type 5, unsigned): the key sealed under the data key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbGet {
    /// The capsule whose key is asked for.
    pub capsule: CapsuleName,
    /// The requester's id for this request, echoed in the answer's `req_ids`.
    pub req_id: u64,
    /// The random salt the sealing key was derived from.
    pub salt: [u8; SALT_LEN],
    /// The key (1 to 1024 bytes) sealed with AES-256-GCM; at most [`SEALED_BYTES_MAX`] bytes.
    pub sealed: Vec<u8>,
}

/// CapsuleDB's signed answer to one or more gets (type 6): a sealed [`AnswerBody`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbAnswer {
    /// The capsule answered for.
    pub capsule: CapsuleName,
    /// CapsuleDB's writer index (whose key signs).
    pub signer: u32,
    /// CapsuleDB's index sequence number when it answered.
    pub index_seq: u64,
    /// The requests answered (1 to [`ANSWER_REQS_MAX`] ids, taken from the gets).
    pub req_ids: Vec<u64>,
    /// The random salt the sealing key was derived from.
    pub salt: [u8; SALT_LEN],
    /// The [`AnswerBody`] sealed under the data key; at most [`ANSWER_SEALED_BYTES_MAX`] bytes.
    pub sealed: Vec<u8>,
    /// CapsuleDB's ECDSA signature over every byte before it (domain `psl-db-answer-v2`).
    pub signature: Signature,
}

/// CapsuleDB's signed frontier (type 7): per writer, the Lamport time up to which its writes are
/// stored, so that bounded memtables may evict them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbHeads {
    /// The capsule the frontier is for.
    pub capsule: CapsuleName,
    /// CapsuleDB's writer index (whose key signs).
    pub signer: u32,
    /// The index sequence number whose blocks hold the frontier.
    pub seq: u64,
    /// Per writer: every write up to this Lamport time is in CapsuleDB's stored blocks.
    pub frontier: Vec<(u32, u64)>,
    /// CapsuleDB's ECDSA signature over every byte before it (domain `psl-db-heads-v1`).
    pub signature: Signature,
}

/// A scan request: the query sealed under the data key (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbScan {
    /// The capsule whose keys are scanned.
    pub capsule: CapsuleName,
    /// The requester's id for this scan, echoed in the [`DbScanAnswer`].
    pub req_id: u64,
    /// The random salt the sealing key was derived from.
    pub salt: [u8; SALT_LEN],
    /// The encoded [`ScanQuery`] sealed under the data key; at most [`SEALED_BYTES_MAX`] bytes.
    pub sealed: Vec<u8>,
}

/// What a scan asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanQuery {
    /// Only keys starting with these bytes (0 to 1024 bytes; empty: every key).
    pub prefix: Vec<u8>,
    /// Only keys strictly above this one.
    pub after: Option<Vec<u8>>,
    /// 1 ..= [`SCAN_LIMIT_MAX`].
    pub limit: u16,
}

/// CapsuleDB's answer to one scan, signed like a get's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbScanAnswer {
    /// The capsule answered for.
    pub capsule: CapsuleName,
    /// CapsuleDB's writer index (whose key signs).
    pub signer: u32,
    /// CapsuleDB's index sequence number when it answered.
    pub index_seq: u64,
    /// The [`DbScan`] answered.
    pub req_id: u64,
    /// The random salt the sealing key was derived from.
    pub salt: [u8; SALT_LEN],
    /// The [`ScanBody`] sealed under the data key; at most [`SCAN_SEALED_BYTES_MAX`] bytes.
    pub sealed: Vec<u8>,
    /// CapsuleDB's ECDSA signature over every byte before it (domain `psl-db-scan-answer-v2`).
    pub signature: Signature,
}

/// What an answer claims for one key, before a front end checked it: the version, whether it
/// is a delete, and which of the body's records wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    /// The newest version CapsuleDB holds for the key: `(lamport, writer)`.
    pub version: Version,
    /// Whether that version is a delete (a tombstone) rather than a put.
    pub deleted: bool,
    /// Index into the body's `records`.
    pub record: u16,
}

/// A scan's body on the wire: the records that wrote its entries (each once), and each key's
/// newest version in key order with the record that proves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanBody {
    /// More keys match after the last one here.
    pub more: bool,
    /// The encoded signed data records the entries' proofs index (each at most
    /// [`ANSWER_RECORD_BYTES_MAX`] bytes).
    pub records: Vec<Vec<u8>>,
    /// The matching keys in strictly increasing order, each with its newest version's proof.
    pub entries: Vec<(Vec<u8>, Proof)>,
}

/// A scan answer once checked ([`ScanBody::check`]): each key's newest version and its value
/// (`None`: deleted), taken from the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scanned {
    /// More keys match after the last one here (ask again with `after` set to it).
    pub more: bool,
    /// In key order: each key, its newest version, and its value (`None`: deleted).
    pub entries: Vec<(Vec<u8>, Version, Option<Vec<u8>>)>,
}

/// Any CapsuleDB message on the fabric (wire types 5 to 9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbMsg {
    /// A worker's read request for one key (type 5).
    Get(DbGet),
    /// CapsuleDB's signed answer to gets (type 6).
    Answer(DbAnswer),
    /// CapsuleDB's signed frontier (type 7).
    Heads(DbHeads),
    /// A worker's prefix scan request (type 8).
    Scan(DbScan),
    /// CapsuleDB's signed answer to one scan (type 9).
    ScanAnswer(DbScanAnswer),
}

/// A read request for the CapsuleDB role to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbRequest {
    /// A read of one key.
    Get(DbGet),
    /// A prefix scan.
    Scan(DbScan),
}

/// What an answer says about its key once checked: `None` = CapsuleDB holds nothing for it;
/// otherwise the newest version with its value (`None` = a tombstone).
pub type Found = Option<(Version, Option<Vec<u8>>)>;

/// One key of an answer on the wire: a miss (`None`) or the version with its proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerEntry {
    /// The key asked for (1 to 1024 bytes).
    pub key: Vec<u8>,
    /// The newest version CapsuleDB holds and the record proving it; `None`: it holds nothing.
    pub found: Option<Proof>,
}

/// One answer carries several keys (the requests CapsuleDB had queued), so that one signature
/// covers them all, and the records that wrote them (each once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerBody {
    /// The encoded signed data records the entries' proofs index (each at most
    /// [`ANSWER_RECORD_BYTES_MAX`] bytes).
    pub records: Vec<Vec<u8>>,
    /// One entry per key answered (1 to [`ANSWER_KEYS_MAX`]).
    pub entries: Vec<AnswerEntry>,
}

/// Most keys in one answer.
pub const ANSWER_KEYS_MAX: usize = 256;

/// Why a CapsuleDB message, or one of its sealed parts or proofs, is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DbWireError {
    /// The message (of this many bytes) is shorter than the 34-byte common prefix.
    #[error("message of {0} bytes is too short")]
    Short(usize),
    /// The prefix's version or type (given) is not a CapsuleDB message's.
    #[error("not a CapsuleDB message (version {0}, type {1})")]
    NotDb(u8, u8),
    /// A field is truncated, out of its bounds, or followed by trailing bytes (which, given).
    #[error("{0}")]
    Malformed(&'static str),
    /// An answer's or frontier's signature does not verify with CapsuleDB's public key.
    #[error("signature does not verify with CapsuleDB's key")]
    Signature,
    /// A sealed key, query or body fails AES-GCM opening with the data key.
    #[error("sealed part does not open with the data key (altered, or another capsule's)")]
    Decryption,
    /// A record carried as proof fails to decode or verify (the verifier's reason, given).
    #[error("carried record refused: {0}")]
    Record(String),
    /// A carried record verifies but does not prove the answered version (why, given).
    #[error("the carried record does not prove the answer: {0}")]
    Unproven(&'static str),
}

/// Whether `b` has the prefix of a CapsuleDB message (types 5 to 9).
pub fn is_db_msg(b: &[u8]) -> bool {
    b.len() >= 2 && b[0] == crate::wire::WIRE_VERSION && (TYPE_GET..=TYPE_SCAN_ANSWER).contains(&b[1])
}

fn prefix(t: u8, capsule: &CapsuleName) -> Vec<u8> {
    let mut b = Vec::with_capacity(128);
    b.push(crate::wire::WIRE_VERSION);
    b.push(t);
    b.extend_from_slice(&capsule.0 .0);
    b
}

impl DbGet {
    /// A request for `key`, sealed under the data key with a fresh random `salt`.
    /// The key should be 1 to 1024 bytes: [`DbGet::open`] refuses others (checked in debug
    /// builds only: keys come from users, through the caller's own limits).
    pub fn seal(capsule: CapsuleName, req_id: u64, key: &[u8], data_key: &DataKey, salt: [u8; SALT_LEN]) -> DbGet {
        debug_assert!(!key.is_empty() && key.len() <= KEY_BYTES_MAX, "CapsuleDB refuses a get of this key length");
        let aad = get_aad(&capsule, req_id);
        let sealed = data_key.seal(&salt, GET_CONTEXT, &aad, key);
        assert!(sealed.len() <= SEALED_BYTES_MAX, "a sealed key within the decoder's bound");
        DbGet { capsule, req_id, salt, sealed }
    }

    /// The requested key.
    pub fn open(&self, data_key: &DataKey) -> Result<Vec<u8>, DbWireError> {
        let key = data_key
            .open(&self.salt, GET_CONTEXT, &get_aad(&self.capsule, self.req_id), &self.sealed)
            .map_err(|_| DbWireError::Decryption)?;
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return Err(DbWireError::Malformed("requested key length"));
        }
        Ok(key.to_vec())
    }
}

fn get_aad(capsule: &CapsuleName, req_id: u64) -> Vec<u8> {
    let mut b = prefix(TYPE_GET, capsule);
    b.extend_from_slice(&req_id.to_le_bytes());
    b
}

fn answer_head(capsule: &CapsuleName, signer: u32, index_seq: u64, req_ids: &[u64]) -> Vec<u8> {
    assert!(req_ids.len() <= u16::MAX as usize, "answer request count does not fit its u16 field");
    let mut b = prefix(TYPE_ANSWER, capsule);
    b.extend_from_slice(&signer.to_le_bytes());
    b.extend_from_slice(&index_seq.to_le_bytes());
    b.extend_from_slice(&(req_ids.len() as u16).to_le_bytes());
    for r in req_ids {
        b.extend_from_slice(&r.to_le_bytes());
    }
    b
}

/// Lengths the fields cannot represent panic (they would misframe the rest); the decoder's
/// other rules are checked where a body is sealed ([`DbAnswer::seal`], [`DbScanAnswer::seal`]).
fn encode_records(b: &mut Vec<u8>, records: &[Vec<u8>]) {
    assert!(records.len() <= u16::MAX as usize, "record count does not fit its u16 field");
    b.extend_from_slice(&(records.len() as u16).to_le_bytes());
    for r in records {
        assert!(r.len() <= u32::MAX as usize, "record length does not fit its u32 field");
        b.extend_from_slice(&(r.len() as u32).to_le_bytes());
        b.extend_from_slice(r);
    }
}

fn decode_records(r: &mut Reader<'_>, max: usize) -> Result<Vec<Vec<u8>>, DbWireError> {
    let n = r.u16()? as usize;
    if n > max {
        return Err(DbWireError::Malformed("record count"));
    }
    let mut records = Vec::with_capacity(n.min(r.0.len() / 4));
    for _ in 0..n {
        let len = r.u32()? as usize;
        if len == 0 || len > ANSWER_RECORD_BYTES_MAX {
            return Err(DbWireError::Malformed("record length"));
        }
        records.push(r.take(len)?.to_vec());
    }
    Ok(records)
}

fn encode_proof(b: &mut Vec<u8>, p: &Proof) {
    b.push(if p.deleted { 1 } else { 2 });
    b.extend_from_slice(&p.version.lamport.to_le_bytes());
    b.extend_from_slice(&p.version.writer.to_le_bytes());
    b.extend_from_slice(&p.record.to_le_bytes());
}

/// The rest of a proof after its tag (1 tombstone, 2 value), `rec` checked against `nrec`.
fn decode_proof(r: &mut Reader<'_>, tag: u8, nrec: usize) -> Result<Proof, DbWireError> {
    let lamport = r.u64()?;
    let writer = r.u32()?;
    let record = r.u16()?;
    if record as usize >= nrec {
        return Err(DbWireError::Malformed("record index"));
    }
    Ok(Proof { version: Version { lamport, writer }, deleted: tag == 1, record })
}

impl AnswerBody {
    /// The plaintext body (v2 layout, see the module docs); panics on counts or lengths that do
    /// not fit their fields.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.records.iter().map(|r| 4 + r.len()).sum::<usize>());
        encode_records(&mut b, &self.records);
        assert!(self.entries.len() <= u16::MAX as usize, "answer key count does not fit its u16 field");
        b.extend_from_slice(&(self.entries.len() as u16).to_le_bytes());
        for e in &self.entries {
            assert!(e.key.len() <= u16::MAX as usize, "answer key length does not fit its u16 field");
            b.extend_from_slice(&(e.key.len() as u16).to_le_bytes());
            b.extend_from_slice(&e.key);
            match &e.found {
                None => b.push(0),
                Some(p) => encode_proof(&mut b, p),
            }
        }
        b
    }

    /// Decodes a plaintext body: 1 to [`ANSWER_KEYS_MAX`] keys of 1 to 1024 bytes, at most as
    /// many records, record indexes in range, no trailing bytes.
    pub fn decode(b: &[u8]) -> Result<AnswerBody, DbWireError> {
        let mut r = Reader(b);
        let records = decode_records(&mut r, ANSWER_KEYS_MAX)?;
        let n = r.u16()? as usize;
        if n == 0 || n > ANSWER_KEYS_MAX {
            return Err(DbWireError::Malformed("answer key count"));
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let klen = r.u16()? as usize;
            if klen == 0 || klen > KEY_BYTES_MAX {
                return Err(DbWireError::Malformed("answer key length"));
            }
            let key = r.take(klen)?.to_vec();
            let found = match r.u8()? {
                0 => None,
                t @ (1 | 2) => Some(decode_proof(&mut r, t, records.len())?),
                _ => return Err(DbWireError::Malformed("answer tag")),
            };
            entries.push(AnswerEntry { key, found });
        }
        if !r.0.is_empty() {
            return Err(DbWireError::Malformed("trailing bytes in answer body"));
        }
        Ok(AnswerBody { records, entries })
    }

    /// Checks every entry against its record ([`RecordCheck`]) and returns what the answer
    /// says per key. Per entry: an error refuses that key only (the others may still be used).
    pub fn check(&self, verifier: &Verifier, signer: u32) -> Vec<(&[u8], Result<Found, DbWireError>)> {
        let mut c = RecordCheck::new(verifier, signer, &self.records);
        self.entries
            .iter()
            .map(|e| {
                let found = match &e.found {
                    None => Ok(None),
                    Some(p) => c.check(&e.key, p).map(Some),
                };
                (e.key.as_slice(), found)
            })
            .collect()
    }
}

/// A verified data record's writer and ops.
type WriterOps = (u32, Vec<Op>);

/// Checks answered versions against the records carried with them, each record verified at
/// most once per answer (see the module docs).
pub struct RecordCheck<'a> {
    verifier: &'a Verifier,
    signer: u32,
    records: &'a [Vec<u8>],
    /// Per record: its writer and ops once verified, or why it was refused.
    opened: Vec<Option<Result<WriterOps, DbWireError>>>,
}

impl<'a> RecordCheck<'a> {
    /// `signer`: CapsuleDB's writer index, whose data records prove nothing.
    pub fn new(verifier: &'a Verifier, signer: u32, records: &'a [Vec<u8>]) -> RecordCheck<'a> {
        RecordCheck { verifier, signer, records, opened: vec![None; records.len()] }
    }

    fn open(&self, bytes: &[u8]) -> Result<WriterOps, DbWireError> {
        let limits = &self.verifier.metadata().meta.policy.limits;
        let rec = Record::decode(bytes, limits).map_err(|e| DbWireError::Record(e.to_string()))?;
        let v = self.verifier.verify_open(rec).map_err(|e| DbWireError::Record(format!("{e:?}")))?;
        let writer = v.record.header().writer;
        if writer == self.signer {
            return Err(DbWireError::Unproven("a data record of CapsuleDB's own key"));
        }
        match &v.body {
            Body::Data(ops) | Body::Atomic(ops) => Ok((writer, ops.clone())),
            _ => Err(DbWireError::Unproven("not a data record")),
        }
    }

    /// The version and value `p` claims for `key`, if its record proves them: the record
    /// verifies, its writer is the version's, and it holds an op on `key` at the version's
    /// Lamport time, a delete if and only if `p` says deleted. The value is the op's.
    pub fn check(&mut self, key: &[u8], p: &Proof) -> Result<(Version, Option<Vec<u8>>), DbWireError> {
        let i = p.record as usize;
        let bytes = self.records.get(i).ok_or(DbWireError::Malformed("record index"))?;
        if self.opened[i].is_none() {
            self.opened[i] = Some(self.open(bytes));
        }
        let (writer, ops) = match self.opened[i].as_ref() {
            Some(Ok(x)) => x,
            Some(Err(e)) => return Err(e.clone()),
            None => return Err(DbWireError::Unproven("record not opened")),
        };
        if *writer != p.version.writer {
            return Err(DbWireError::Unproven("the record's writer is not the answered version's"));
        }
        let op = ops
            .iter()
            .find(|o| o.lamport == p.version.lamport && o.key == key)
            .ok_or(DbWireError::Unproven("no op on the key at the answered version"))?;
        match (&op.action, p.deleted) {
            (Action::Put(v), false) => Ok((p.version, Some(v.clone()))),
            (Action::Delete, true) => Ok((p.version, None)),
            _ => Err(DbWireError::Unproven("the op's kind is not the answered one")),
        }
    }
}

impl DbAnswer {
    /// Seals `body` for `req_ids` and signs the message with CapsuleDB's key.
    #[allow(clippy::too_many_arguments)]
    pub fn seal(
        capsule: CapsuleName,
        signer: u32,
        index_seq: u64,
        req_ids: Vec<u64>,
        body: &AnswerBody,
        data_key: &DataKey,
        salt: [u8; SALT_LEN],
        key: &SigningKey,
    ) -> DbAnswer {
        assert!(!req_ids.is_empty() && req_ids.len() <= ANSWER_REQS_MAX, "callers split answers");
        let aad = answer_head(&capsule, signer, index_seq, &req_ids);
        let plain = body.encode();
        // The receiver decodes the body with these rules (a full decode: debug builds only).
        debug_assert!(AnswerBody::decode(&plain).as_ref() == Ok(body), "an answer body must decode to itself");
        let sealed = data_key.seal(&salt, ANSWER_CONTEXT, &aad, &plain);
        assert!(sealed.len() <= ANSWER_SEALED_BYTES_MAX, "an answer body within the decoder's bound");
        let mut a = DbAnswer { capsule, signer, index_seq, req_ids, salt, sealed, signature: Signature([0; 64]) };
        a.signature = key.sign(&a.digest());
        a
    }

    fn digest(&self) -> Hash256 {
        let mut b = answer_head(&self.capsule, self.signer, self.index_seq, &self.req_ids);
        b.extend_from_slice(&self.salt);
        b.extend_from_slice(&(self.sealed.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.sealed);
        sha256(&[ANSWER_DOMAIN, &b])
    }

    /// Checks the signature with CapsuleDB's public key, then opens the body.
    pub fn verify_open(&self, key: &VerifyingKey, data_key: &DataKey) -> Result<AnswerBody, DbWireError> {
        key.verify(&self.digest(), &self.signature).map_err(|_| DbWireError::Signature)?;
        let aad = answer_head(&self.capsule, self.signer, self.index_seq, &self.req_ids);
        let plain =
            data_key.open(&self.salt, ANSWER_CONTEXT, &aad, &self.sealed).map_err(|_| DbWireError::Decryption)?;
        AnswerBody::decode(&plain)
    }
}

impl DbHeads {
    /// A frontier of at most [`DB_HEADS_MAX`] writers (more panics) for index `seq`, signed with
    /// CapsuleDB's key.
    pub fn sign(capsule: CapsuleName, signer: u32, seq: u64, frontier: Vec<(u32, u64)>, key: &SigningKey) -> DbHeads {
        assert!(frontier.len() <= DB_HEADS_MAX, "callers cap the frontier");
        let mut h = DbHeads { capsule, signer, seq, frontier, signature: Signature([0; 64]) };
        h.signature = key.sign(&h.digest());
        h
    }

    fn body(&self) -> Vec<u8> {
        assert!(self.frontier.len() <= DB_HEADS_MAX, "heads within DB_HEADS_MAX (the decoder refuses more)");
        let mut b = prefix(TYPE_HEADS, &self.capsule);
        b.extend_from_slice(&self.signer.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&(self.frontier.len() as u16).to_le_bytes());
        for (w, l) in &self.frontier {
            b.extend_from_slice(&w.to_le_bytes());
            b.extend_from_slice(&l.to_le_bytes());
        }
        b
    }

    fn digest(&self) -> Hash256 {
        sha256(&[HEADS_DOMAIN, &self.body()])
    }

    /// Checks the signature with CapsuleDB's public key.
    pub fn verify(&self, key: &VerifyingKey) -> Result<(), DbWireError> {
        key.verify(&self.digest(), &self.signature).map_err(|_| DbWireError::Signature)
    }
}

fn scan_aad(capsule: &CapsuleName, req_id: u64) -> Vec<u8> {
    let mut b = prefix(TYPE_SCAN, capsule);
    b.extend_from_slice(&req_id.to_le_bytes());
    b
}

impl ScanQuery {
    /// The plaintext query (layout in the module docs); panics on a prefix or `after` longer than
    /// `u16::MAX` bytes.
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.prefix.len() <= u16::MAX as usize, "scan prefix length does not fit its u16 field");
        assert!(self.after.as_ref().is_none_or(|a| a.len() <= u16::MAX as usize), "scan after length");
        let mut b = Vec::with_capacity(8 + self.prefix.len() + self.after.as_ref().map_or(0, |a| a.len()));
        b.extend_from_slice(&self.limit.to_le_bytes());
        b.extend_from_slice(&(self.prefix.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.prefix);
        match &self.after {
            None => b.push(0),
            Some(a) => {
                b.push(1);
                b.extend_from_slice(&(a.len() as u16).to_le_bytes());
                b.extend_from_slice(a);
            }
        }
        b
    }

    /// Decodes a plaintext query: limit 1 to [`SCAN_LIMIT_MAX`], prefix at most 1024 bytes,
    /// `after` 1 to 1024 bytes, no trailing bytes.
    pub fn decode(b: &[u8]) -> Result<ScanQuery, DbWireError> {
        let mut r = Reader(b);
        let limit = r.u16()?;
        if limit == 0 || limit as usize > SCAN_LIMIT_MAX {
            return Err(DbWireError::Malformed("scan limit"));
        }
        let plen = r.u16()? as usize;
        if plen > KEY_BYTES_MAX {
            return Err(DbWireError::Malformed("scan prefix length"));
        }
        let prefix = r.take(plen)?.to_vec();
        let after = match r.u8()? {
            0 => None,
            1 => {
                let alen = r.u16()? as usize;
                if alen == 0 || alen > KEY_BYTES_MAX {
                    return Err(DbWireError::Malformed("scan after length"));
                }
                Some(r.take(alen)?.to_vec())
            }
            _ => return Err(DbWireError::Malformed("scan after tag")),
        };
        if !r.0.is_empty() {
            return Err(DbWireError::Malformed("trailing bytes in scan query"));
        }
        Ok(ScanQuery { prefix, after, limit })
    }
}

impl DbScan {
    /// A scan request, sealed under the data key with a fresh random `salt`.
    /// The query should be one [`ScanQuery::decode`] accepts (limit 1 to [`SCAN_LIMIT_MAX`],
    /// prefix and `after` within 1024 bytes): checked in debug builds only, as prefixes come from
    /// users through the caller's own limits.
    pub fn seal(capsule: CapsuleName, req_id: u64, q: &ScanQuery, data_key: &DataKey, salt: [u8; SALT_LEN]) -> DbScan {
        let aad = scan_aad(&capsule, req_id);
        let plain = q.encode();
        debug_assert!(ScanQuery::decode(&plain).as_ref() == Ok(q), "CapsuleDB refuses this scan query");
        let sealed = data_key.seal(&salt, SCAN_CONTEXT, &aad, &plain);
        assert!(sealed.len() <= SEALED_BYTES_MAX, "a sealed scan query within the decoder's bound");
        DbScan { capsule, req_id, salt, sealed }
    }

    /// The query, opened with the data key and decoded.
    pub fn open(&self, data_key: &DataKey) -> Result<ScanQuery, DbWireError> {
        let q = data_key
            .open(&self.salt, SCAN_CONTEXT, &scan_aad(&self.capsule, self.req_id), &self.sealed)
            .map_err(|_| DbWireError::Decryption)?;
        ScanQuery::decode(&q)
    }
}

impl ScanBody {
    /// The plaintext body (v2 layout, see the module docs); panics on counts or lengths that do
    /// not fit their fields.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.records.iter().map(|r| 4 + r.len()).sum::<usize>());
        b.push(u8::from(self.more));
        encode_records(&mut b, &self.records);
        assert!(self.entries.len() <= u16::MAX as usize, "scan entry count does not fit its u16 field");
        b.extend_from_slice(&(self.entries.len() as u16).to_le_bytes());
        for (key, p) in &self.entries {
            assert!(key.len() <= u16::MAX as usize, "scan key length does not fit its u16 field");
            b.extend_from_slice(&(key.len() as u16).to_le_bytes());
            b.extend_from_slice(key);
            encode_proof(&mut b, p);
        }
        b
    }

    /// Decodes a body: at most [`SCAN_LIMIT_MAX`] entries and records, keys non-empty, bounded
    /// and strictly increasing, record indexes in range.
    pub fn decode(b: &[u8]) -> Result<ScanBody, DbWireError> {
        let mut r = Reader(b);
        let more = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(DbWireError::Malformed("scan more flag")),
        };
        let records = decode_records(&mut r, SCAN_LIMIT_MAX)?;
        let n = r.u16()? as usize;
        if n > SCAN_LIMIT_MAX {
            return Err(DbWireError::Malformed("scan entry count"));
        }
        let mut entries: Vec<(Vec<u8>, Proof)> = Vec::with_capacity(n.min(b.len() / 16));
        for _ in 0..n {
            let klen = r.u16()? as usize;
            if klen == 0 || klen > KEY_BYTES_MAX {
                return Err(DbWireError::Malformed("scan key length"));
            }
            let key = r.take(klen)?.to_vec();
            if entries.last().is_some_and(|(k, _)| *k >= key) {
                return Err(DbWireError::Malformed("scan keys out of order"));
            }
            let p = match r.u8()? {
                t @ (1 | 2) => decode_proof(&mut r, t, records.len())?,
                _ => return Err(DbWireError::Malformed("scan entry tag")),
            };
            entries.push((key, p));
        }
        if !r.0.is_empty() {
            return Err(DbWireError::Malformed("trailing bytes in scan body"));
        }
        Ok(ScanBody { more, records, entries })
    }

    /// Checks every entry against its record; any entry that fails refuses the whole answer
    /// (a scan answer is one page: a gap would hide keys).
    pub fn check(&self, verifier: &Verifier, signer: u32) -> Result<Scanned, DbWireError> {
        let mut c = RecordCheck::new(verifier, signer, &self.records);
        let mut entries = Vec::with_capacity(self.entries.len());
        for (key, p) in &self.entries {
            let (v, val) = c.check(key, p)?;
            entries.push((key.clone(), v, val));
        }
        Ok(Scanned { more: self.more, entries })
    }
}

fn scan_answer_head(capsule: &CapsuleName, signer: u32, index_seq: u64, req_id: u64) -> Vec<u8> {
    let mut b = prefix(TYPE_SCAN_ANSWER, capsule);
    b.extend_from_slice(&signer.to_le_bytes());
    b.extend_from_slice(&index_seq.to_le_bytes());
    b.extend_from_slice(&req_id.to_le_bytes());
    b
}

impl DbScanAnswer {
    /// Seals `body` for request `req_id` and signs the message with CapsuleDB's key.
    #[allow(clippy::too_many_arguments)]
    pub fn seal(
        capsule: CapsuleName,
        signer: u32,
        index_seq: u64,
        req_id: u64,
        body: &ScanBody,
        data_key: &DataKey,
        salt: [u8; SALT_LEN],
        key: &SigningKey,
    ) -> DbScanAnswer {
        let aad = scan_answer_head(&capsule, signer, index_seq, req_id);
        let plain = body.encode();
        // The receiver decodes the body with these rules (a full decode: debug builds only).
        debug_assert!(ScanBody::decode(&plain).as_ref() == Ok(body), "a scan body must decode to itself");
        let sealed = data_key.seal(&salt, SCAN_ANSWER_CONTEXT, &aad, &plain);
        assert!(sealed.len() <= SCAN_SEALED_BYTES_MAX, "a scan answer body within the decoder's bound");
        let mut a = DbScanAnswer { capsule, signer, index_seq, req_id, salt, sealed, signature: Signature([0; 64]) };
        a.signature = key.sign(&a.digest());
        a
    }

    fn digest(&self) -> Hash256 {
        let mut b = scan_answer_head(&self.capsule, self.signer, self.index_seq, self.req_id);
        b.extend_from_slice(&self.salt);
        b.extend_from_slice(&(self.sealed.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.sealed);
        sha256(&[SCAN_ANSWER_DOMAIN, &b])
    }

    /// Checks the signature with CapsuleDB's public key, then opens the body.
    pub fn verify_open(&self, key: &VerifyingKey, data_key: &DataKey) -> Result<ScanBody, DbWireError> {
        key.verify(&self.digest(), &self.signature).map_err(|_| DbWireError::Signature)?;
        let aad = scan_answer_head(&self.capsule, self.signer, self.index_seq, self.req_id);
        let plain =
            data_key.open(&self.salt, SCAN_ANSWER_CONTEXT, &aad, &self.sealed).map_err(|_| DbWireError::Decryption)?;
        ScanBody::decode(&plain)
    }
}

impl DbMsg {
    /// The capsule the message is about.
    pub fn capsule(&self) -> CapsuleName {
        match self {
            DbMsg::Get(g) => g.capsule,
            DbMsg::Answer(a) => a.capsule,
            DbMsg::Heads(h) => h.capsule,
            DbMsg::Scan(q) => q.capsule,
            DbMsg::ScanAnswer(a) => a.capsule,
        }
    }

    /// Encodes the message; counts and sealed lengths over the decoder's bounds are a bug of the
    /// sender (the constructors `seal` and `sign` keep within them) and panic.
    pub fn encode(&self) -> Vec<u8> {
        let b = match self {
            DbMsg::Get(g) => {
                assert!(g.sealed.len() <= SEALED_BYTES_MAX, "a get's sealed key within SEALED_BYTES_MAX");
                let mut b = get_aad(&g.capsule, g.req_id);
                b.extend_from_slice(&g.salt);
                b.extend_from_slice(&(g.sealed.len() as u32).to_le_bytes());
                b.extend_from_slice(&g.sealed);
                b
            }
            DbMsg::Answer(a) => {
                assert!(
                    !a.req_ids.is_empty() && a.req_ids.len() <= ANSWER_REQS_MAX,
                    "an answer names 1 to ANSWER_REQS_MAX requests"
                );
                assert!(a.sealed.len() <= ANSWER_SEALED_BYTES_MAX, "an answer's sealed body within its bound");
                let mut b = answer_head(&a.capsule, a.signer, a.index_seq, &a.req_ids);
                b.extend_from_slice(&a.salt);
                b.extend_from_slice(&(a.sealed.len() as u32).to_le_bytes());
                b.extend_from_slice(&a.sealed);
                b.extend_from_slice(&a.signature.0);
                b
            }
            DbMsg::Heads(h) => {
                let mut b = h.body();
                b.extend_from_slice(&h.signature.0);
                b
            }
            DbMsg::Scan(q) => {
                assert!(q.sealed.len() <= SEALED_BYTES_MAX, "a scan's sealed query within SEALED_BYTES_MAX");
                let mut b = scan_aad(&q.capsule, q.req_id);
                b.extend_from_slice(&q.salt);
                b.extend_from_slice(&(q.sealed.len() as u32).to_le_bytes());
                b.extend_from_slice(&q.sealed);
                b
            }
            DbMsg::ScanAnswer(a) => {
                assert!(a.sealed.len() <= SCAN_SEALED_BYTES_MAX, "a scan answer's sealed body within its bound");
                let mut b = scan_answer_head(&a.capsule, a.signer, a.index_seq, a.req_id);
                b.extend_from_slice(&a.salt);
                b.extend_from_slice(&(a.sealed.len() as u32).to_le_bytes());
                b.extend_from_slice(&a.sealed);
                b.extend_from_slice(&a.signature.0);
                b
            }
        };
        // Every message leaves as our own decoder reads it (a full decode: debug builds only).
        debug_assert!(DbMsg::decode(&b).as_ref() == Ok(self), "an encoded message must decode to itself");
        b
    }

    /// Decodes the framing (bounded, total); signatures and sealed parts are checked by
    /// [`DbAnswer::verify_open`], [`DbScanAnswer::verify_open`], [`DbHeads::verify`],
    /// [`DbGet::open`] and [`DbScan::open`].
    pub fn decode(b: &[u8]) -> Result<DbMsg, DbWireError> {
        if b.len() < PREFIX_LEN {
            return Err(DbWireError::Short(b.len()));
        }
        if !is_db_msg(b) {
            return Err(DbWireError::NotDb(b[0], b[1]));
        }
        let mut name = [0u8; 32];
        name.copy_from_slice(&b[2..34]);
        let capsule = CapsuleName(Hash256(name));
        let mut r = Reader(&b[PREFIX_LEN..]);
        let m = match b[1] {
            TYPE_GET => {
                let req_id = r.u64()?;
                let salt = r.salt()?;
                let sealed = r.sealed()?;
                DbMsg::Get(DbGet { capsule, req_id, salt, sealed })
            }
            TYPE_ANSWER => {
                let signer = r.u32()?;
                let index_seq = r.u64()?;
                let n = r.u16()? as usize;
                if n == 0 || n > ANSWER_REQS_MAX {
                    return Err(DbWireError::Malformed("answer request count"));
                }
                let mut req_ids = Vec::with_capacity(n);
                for _ in 0..n {
                    req_ids.push(r.u64()?);
                }
                let salt = r.salt()?;
                let sealed = r.sealed_max(ANSWER_SEALED_BYTES_MAX)?;
                let signature = r.signature()?;
                DbMsg::Answer(DbAnswer { capsule, signer, index_seq, req_ids, salt, sealed, signature })
            }
            TYPE_SCAN => {
                let req_id = r.u64()?;
                let salt = r.salt()?;
                let sealed = r.sealed()?;
                DbMsg::Scan(DbScan { capsule, req_id, salt, sealed })
            }
            TYPE_SCAN_ANSWER => {
                let signer = r.u32()?;
                let index_seq = r.u64()?;
                let req_id = r.u64()?;
                let salt = r.salt()?;
                let sealed = r.sealed_max(SCAN_SEALED_BYTES_MAX)?;
                let signature = r.signature()?;
                DbMsg::ScanAnswer(DbScanAnswer { capsule, signer, index_seq, req_id, salt, sealed, signature })
            }
            _ => {
                let signer = r.u32()?;
                let seq = r.u64()?;
                let n = r.u16()? as usize;
                if n > DB_HEADS_MAX {
                    return Err(DbWireError::Malformed("heads count"));
                }
                let mut frontier = Vec::with_capacity(n);
                for _ in 0..n {
                    frontier.push((r.u32()?, r.u64()?));
                }
                let signature = r.signature()?;
                DbMsg::Heads(DbHeads { capsule, signer, seq, frontier, signature })
            }
        };
        if !r.0.is_empty() {
            return Err(DbWireError::Malformed("trailing bytes"));
        }
        Ok(m)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DbWireError> {
        if self.0.len() < n {
            return Err(DbWireError::Malformed("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DbWireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DbWireError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, DbWireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, DbWireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn salt(&mut self) -> Result<[u8; SALT_LEN], DbWireError> {
        Ok(self.take(SALT_LEN)?.try_into().expect("salt length"))
    }
    fn sealed(&mut self) -> Result<Vec<u8>, DbWireError> {
        self.sealed_max(SEALED_BYTES_MAX)
    }
    fn sealed_max(&mut self, max: usize) -> Result<Vec<u8>, DbWireError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(DbWireError::Malformed("sealed part over the limit"));
        }
        Ok(self.take(n)?.to_vec())
    }
    fn signature(&mut self) -> Result<Signature, DbWireError> {
        Ok(Signature(self.take(64)?.try_into().expect("64 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn keys() -> (DataKey, SigningKey, VerifyingKey, VerifyingKey) {
        let owner = psl_crypto::OwnerKey::from_seed(&[3; 32]).unwrap();
        let app = owner.app(1).unwrap();
        let sk = app.writer(70).unwrap();
        (app.data_key(), sk, app.public().writer(70).unwrap(), app.public().writer(71).unwrap())
    }

    #[test]
    fn get_and_answer_round_trip_and_bind_everything() {
        let (dk, sk, pk, other) = keys();
        let capsule = CapsuleName(Hash256([9; 32]));
        let g = DbGet::seal(capsule, 77, b"hello", &dk, [1; 16]);
        let DbMsg::Get(back) = DbMsg::decode(&DbMsg::Get(g.clone()).encode()).unwrap() else { panic!("a get") };
        assert_eq!(back.open(&dk).unwrap(), b"hello");
        assert!(DbGet { req_id: 78, ..g.clone() }.open(&dk).is_err(), "the request id is bound");
        assert!(!g.sealed.windows(5).any(|w| w == b"hello"), "the key is not in the clear");

        let body = AnswerBody {
            records: vec![vec![7; 40]],
            entries: vec![
                AnswerEntry {
                    key: b"hello".to_vec(),
                    found: Some(Proof { version: Version { lamport: 5, writer: 9 }, deleted: false, record: 0 }),
                },
                AnswerEntry { key: b"x".to_vec(), found: None },
            ],
        };
        let a = DbAnswer::seal(capsule, 70, 4, vec![77, 80], &body, &dk, [2; 16], &sk);
        let DbMsg::Answer(back) = DbMsg::decode(&DbMsg::Answer(a.clone()).encode()).unwrap() else { panic!("answer") };
        assert_eq!(back.verify_open(&pk, &dk).unwrap(), body);
        assert_eq!(a.verify_open(&other, &dk), Err(DbWireError::Signature));
        assert!(DbAnswer { req_ids: vec![77, 81], ..a.clone() }.verify_open(&pk, &dk).is_err());
        assert!(DbAnswer { index_seq: 5, ..a.clone() }.verify_open(&pk, &dk).is_err());
        let mut s = a.clone();
        s.sealed[0] ^= 1;
        assert!(s.verify_open(&pk, &dk).is_err());

        let q = ScanQuery { prefix: b"p/".to_vec(), after: Some(b"p/a".to_vec()), limit: 10 };
        let sc = DbScan::seal(capsule, 5, &q, &dk, [3; 16]);
        let DbMsg::Scan(back) = DbMsg::decode(&DbMsg::Scan(sc.clone()).encode()).unwrap() else { panic!("a scan") };
        assert_eq!(back.open(&dk).unwrap(), q);
        assert!(DbScan { req_id: 6, ..sc.clone() }.open(&dk).is_err(), "the request id is bound");
        let sb = ScanBody {
            more: true,
            records: vec![vec![1; 10], vec![2; 20]],
            entries: vec![
                (b"p/b".to_vec(), Proof { version: Version { lamport: 1, writer: 2 }, deleted: false, record: 1 }),
                (b"p/c".to_vec(), Proof { version: Version { lamport: 3, writer: 4 }, deleted: true, record: 0 }),
            ],
        };
        let sa = DbScanAnswer::seal(capsule, 70, 9, 5, &sb, &dk, [4; 16], &sk);
        let DbMsg::ScanAnswer(back) = DbMsg::decode(&DbMsg::ScanAnswer(sa.clone()).encode()).unwrap() else {
            panic!("a scan answer")
        };
        assert_eq!(back.verify_open(&pk, &dk).unwrap(), sb);
        assert_eq!(sa.verify_open(&other, &dk), Err(DbWireError::Signature));
        assert!(DbScanAnswer { req_id: 6, ..sa.clone() }.verify_open(&pk, &dk).is_err());
        assert!(DbScanAnswer { index_seq: 10, ..sa.clone() }.verify_open(&pk, &dk).is_err());
        let unordered = ScanBody {
            more: false,
            records: sb.records.clone(),
            entries: vec![sb.entries[1].clone(), sb.entries[0].clone()],
        };
        assert!(ScanBody::decode(&unordered.encode()).is_err(), "keys must increase");

        let h = DbHeads::sign(capsule, 70, 3, vec![(1, 10), (2, 20)], &sk);
        let DbMsg::Heads(back) = DbMsg::decode(&DbMsg::Heads(h.clone()).encode()).unwrap() else { panic!("heads") };
        back.verify(&pk).unwrap();
        assert!(DbHeads { frontier: vec![(1, 11), (2, 20)], ..h.clone() }.verify(&pk).is_err());
        assert!(h.verify(&other).is_err());
    }

    #[test]
    #[should_panic(expected = "callers split answers")]
    fn sealing_an_answer_to_no_request_is_a_bug() {
        let (dk, sk, _, _) = keys();
        let body = AnswerBody { records: Vec::new(), entries: vec![AnswerEntry { key: b"k".to_vec(), found: None }] };
        let _ = DbAnswer::seal(CapsuleName(Hash256([9; 32])), 70, 1, Vec::new(), &body, &dk, [2; 16], &sk);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "must decode to itself")]
    fn sealing_a_body_the_receiver_refuses_is_a_bug() {
        let (dk, sk, _, _) = keys();
        // A proof naming a record the body does not carry.
        let p = Proof { version: Version { lamport: 1, writer: 2 }, deleted: false, record: 0 };
        let body =
            AnswerBody { records: Vec::new(), entries: vec![AnswerEntry { key: b"k".to_vec(), found: Some(p) }] };
        let _ = DbAnswer::seal(CapsuleName(Hash256([9; 32])), 70, 1, vec![1], &body, &dk, [2; 16], &sk);
    }

    #[test]
    #[should_panic(expected = "within SEALED_BYTES_MAX")]
    fn encoding_a_get_over_the_decoder_bound_is_a_bug() {
        let g = DbGet {
            capsule: CapsuleName(Hash256([9; 32])),
            req_id: 1,
            salt: [0; 16],
            sealed: vec![0; SEALED_BYTES_MAX + 1],
        };
        let _ = DbMsg::Get(g).encode();
    }

    #[test]
    fn decoders_name_the_bounds_they_refuse() {
        let capsule = CapsuleName(Hash256([9; 32]));
        let mut b = prefix(TYPE_GET, &capsule);
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&[0; SALT_LEN]);
        b.extend_from_slice(&(SEALED_BYTES_MAX as u32 + 1).to_le_bytes());
        assert_eq!(DbMsg::decode(&b), Err(DbWireError::Malformed("sealed part over the limit")));
        let mut b = prefix(TYPE_ANSWER, &capsule);
        b.extend_from_slice(&[0; 12]);
        b.extend_from_slice(&0u16.to_le_bytes());
        assert_eq!(DbMsg::decode(&b), Err(DbWireError::Malformed("answer request count")));
        let mut b = prefix(TYPE_HEADS, &capsule);
        b.extend_from_slice(&[0; 12]);
        b.extend_from_slice(&(DB_HEADS_MAX as u16 + 1).to_le_bytes());
        assert_eq!(DbMsg::decode(&b), Err(DbWireError::Malformed("heads count")));
        let mut q = ScanQuery { prefix: Vec::new(), after: None, limit: 0 }.encode();
        assert_eq!(ScanQuery::decode(&q), Err(DbWireError::Malformed("scan limit")));
        q[0] = 1;
        q.push(0);
        assert_eq!(ScanQuery::decode(&q), Err(DbWireError::Malformed("trailing bytes in scan query")));
    }

    #[test]
    fn record_check_proves_only_what_the_record_wrote() {
        let owner = psl_crypto::OwnerKey::from_seed(&[4; 32]).unwrap();
        let app = owner.app(1).unwrap();
        let meta = psl_capsule::new_capsule(&owner, 1, "dbwire-proofs", 0, psl_capsule::Limits::default()).unwrap();
        let verifier = Verifier::new(meta.clone(), Some(app.data_key()));
        let (w, db) = (0x10001, 0x20002);
        let rec = psl_capsule::Author::new(&meta, &app, w)
            .unwrap()
            .write_ops([(b"a".to_vec(), Some(b"va".to_vec())), (b"b".to_vec(), None::<Vec<u8>>)])
            .unwrap();
        let Body::Data(ops) = &verifier.verify_open(rec.clone()).unwrap().body else { panic!("data") };
        let (la, lb) = (ops[0].lamport, ops[1].lamport);
        let own = psl_capsule::Author::new(&meta, &app, db)
            .unwrap()
            .write_ops([(b"a".to_vec(), Some(b"x".to_vec()))])
            .unwrap();
        let records = vec![rec.bytes().to_vec(), own.bytes().to_vec(), b"garbage".to_vec()];
        let mut c = RecordCheck::new(&verifier, db, &records);
        let p = |lamport, writer, deleted, record| Proof { version: Version { lamport, writer }, deleted, record };
        assert_eq!(
            c.check(b"a", &p(la, w, false, 0)).unwrap(),
            (Version { lamport: la, writer: w }, Some(b"va".to_vec()))
        );
        assert_eq!(c.check(b"b", &p(lb, w, true, 0)).unwrap(), (Version { lamport: lb, writer: w }, None));
        for (key, proof) in [
            (&b"a"[..], p(la + 1, w, false, 0)), // made-up Lamport time
            (b"a", p(la, w + 1, false, 0)),      // another writer
            (b"c", p(la, w, false, 0)),          // a key the record never wrote
            (b"a", p(la, w, true, 0)),           // a put claimed as a delete
            (b"b", p(lb, w, false, 0)),          // a delete claimed as a put
            (b"a", p(0, db, false, 1)),          // CapsuleDB's own data record
            (b"a", p(la, w, false, 2)),          // not a record
            (b"a", p(la, w, false, 3)),          // no such record
        ] {
            assert!(c.check(key, &proof).is_err(), "{key:?} {proof:?}");
        }
        let mut tampered = records.clone();
        let n = tampered[0].len();
        tampered[0][n - 70] ^= 1;
        assert!(RecordCheck::new(&verifier, db, &tampered).check(b"a", &p(la, w, false, 0)).is_err());
    }

    proptest! {
        #[test]
        fn answer_body_round_trip(
            key in proptest::collection::vec(any::<u8>(), 1..50),
            l in any::<u64>(),
            w in any::<u32>(),
            tag in 0u8..3,
            records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..80), 1..4),
            rec in any::<u16>(),
        ) {
            let record = rec % records.len() as u16;
            let found = match tag {
                0 => None,
                t => Some(Proof { version: Version { lamport: l, writer: w }, deleted: t == 1, record }),
            };
            let b = AnswerBody { records, entries: vec![AnswerEntry { key: key.clone(), found }, AnswerEntry { key, found: None }] };
            prop_assert_eq!(AnswerBody::decode(&b.encode()).unwrap(), b.clone());
            // A record index out of range is refused.
            let mut bad = b;
            bad.entries[0].found = Some(Proof { version: Version { lamport: l, writer: w }, deleted: false, record: bad.records.len() as u16 });
            prop_assert!(AnswerBody::decode(&bad.encode()).is_err());
        }

        #[test]
        fn scan_query_and_body_round_trip(
            prefix in proptest::collection::vec(any::<u8>(), 0..20),
            after in proptest::option::of(proptest::collection::vec(any::<u8>(), 1..20)),
            limit in 1u16..=1024,
            keys in proptest::collection::btree_set(proptest::collection::vec(any::<u8>(), 1..12), 0..20),
            more in any::<bool>(),
        ) {
            let q = ScanQuery { prefix, after, limit };
            prop_assert_eq!(ScanQuery::decode(&q.encode()).unwrap(), q);
            let records: Vec<Vec<u8>> = (0..3).map(|i| vec![i as u8; 5 + i]).collect();
            let entries = keys.into_iter().enumerate().map(|(i, k)| {
                (k, Proof { version: Version { lamport: i as u64, writer: 3 }, deleted: i % 3 == 0, record: (i % 3) as u16 })
            }).collect();
            let b = ScanBody { more, records, entries };
            prop_assert_eq!(ScanBody::decode(&b.encode()).unwrap(), b);
        }

        #[test]
        fn decode_never_panics(t in 5u8..10, bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut b = vec![1u8, t];
            b.extend_from_slice(&[0; 32]);
            b.extend_from_slice(&bytes);
            let _ = DbMsg::decode(&b);
            let _ = DbMsg::decode(&bytes);
            let _ = AnswerBody::decode(&bytes);
            let _ = ScanQuery::decode(&bytes);
            let _ = ScanBody::decode(&bytes);
        }
    }
}
