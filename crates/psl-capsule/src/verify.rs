//! The verifier: the only place a [`Verified`] value is made.
//!
//! Rejections carry the record's identity and the reason by value: they are the cold path, and
//! callers count and log them, so the size of `Rejected` is not worth a box.
#![allow(clippy::result_large_err)]

use crate::body::Body;
use crate::certs::{CertError, KeyStatement, Revocation, WriterCert};
use crate::codec::DecodeError;
use crate::meta::WriterKeys;
use crate::meta::{CapsuleName, SignedMetadata};
use crate::record::{Header, Kind, Record};
use crate::rotation::{RotationCert, RotationError, KEY_GENERATIONS_MAX};
use psl_crypto::{DataKey, Hash256, VerifyingKey};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

/// Most records held back, across writers, for want of their writer's certificate.
pub const HELD_RECORDS_MAX: usize = 4096;
/// Most records held back for one (key generation, writer).
pub const HELD_PER_WRITER_MAX: usize = 1024;
/// Most bytes (encoded records) held back, across writers, for want of a certificate. With the
/// count bound alone, 4,096 records of the capsule's largest size would pin gigabytes.
pub const HELD_BYTES_MAX: usize = 32 << 20;
/// Most bytes held back for one (key generation, writer).
pub const HELD_BYTES_PER_WRITER_MAX: usize = 8 << 20;
/// How long a record waits for its writer's certificate before it is refused as uncertified.
pub const CERT_WAIT_MS: u64 = 10_000;
/// Most certified writers one verifier keeps (a bound on the certificate table).
pub const CERTIFIED_WRITERS_MAX: usize = 1 << 16;
/// Most revocations kept per (generation, writer).
pub const REVOCATIONS_PER_WRITER_MAX: usize = 16;

/// A value that has passed the verifier. The field is private to this module, so no other code
/// can construct one: holding a `Verified<Record>` proves the checks ran.
#[derive(Clone, PartialEq, Eq)]
pub struct Verified<T>(T);

impl<T> Verified<T> {
    /// The verified value, giving up the proof that it was verified.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> std::ops::Deref for Verified<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: fmt::Debug> fmt::Debug for Verified<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Verified({:?})", self.0)
    }
}

/// A verified record together with its decrypted, decoded body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The record as received (its body still sealed).
    pub record: Record,
    /// The record's body, decrypted (for a Cert record, decoded from the clear), decoded and
    /// checked against the capsule's limits.
    pub body: Body,
}

impl Verified<Opened> {
    /// Separates the verified record from its opened body, without copying either.
    pub fn split(self) -> (Verified<Record>, Body) {
        (Verified(self.0.record), self.0.body)
    }

    /// A copy of the verified record (cheap: the record's bytes are shared).
    pub fn record(&self) -> Verified<Record> {
        Verified(self.0.record.clone())
    }
}

/// Which check refused a record. `name()` is stable: logs and metrics label rejections with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    /// `encoding`: the bytes do not decode as a record under the capsule's limits.
    #[error("{0}")]
    Encoding(DecodeError),
    /// `capsule`: the header names another capsule.
    #[error("record belongs to capsule {found}, not this one")]
    Capsule {
        /// The capsule name in the record's header.
        found: Hash256,
    },
    /// `writer`: the writer index is 2^31 or more, lies in the capsule servers' range (their keys
    /// sign acks, never records), or its key cannot be derived.
    #[error("writer index {0} has no derivable public key (a hardened index, or a failed derivation)")]
    Writer(u32),
    /// `key-generation`: the record's key generation is unknown to this verifier, or not yet in
    /// force at the record's epoch.
    #[error("key generation {0} is not known to this verifier, or not yet in force at the record's epoch")]
    KeyGeneration(u32),
    /// `retired-key`: a newer key generation is in force at the record's epoch.
    #[error("key generation {key_gen} was retired from epoch {retired_from}; the record claims epoch {epoch}")]
    RetiredKey {
        /// The record's key generation.
        key_gen: u32,
        /// The record's header epoch.
        epoch: u64,
        /// The next generation's `from_epoch`, from which `key_gen` is retired.
        retired_from: u64,
    },
    /// `kind`: a SYNC record by a writer that is not one of the policy's coordinators.
    #[error("{kind} records may only be written by a coordinator (writer {coordinator} or a shadow below it)")]
    KindNotAllowed {
        /// Name of the refused kind.
        kind: &'static str,
        /// The policy's primary coordinator writer index.
        coordinator: u32,
    },
    /// `structure`: a header rule is broken (seq 0 without a zero `prev` or the reverse, a data
    /// record linking to a non-coordinator, a Cert record in a derived capsule, ...).
    #[error("{0}")]
    Structure(&'static str),
    /// `signature`: the signature over the record hash does not verify under this writer's key.
    #[error("signature does not verify under writer {0}'s key")]
    Signature(u32),
    /// `decryption`: the body does not open under the data key of its generation (or the
    /// verifier lacks that key).
    #[error("body does not decrypt under the application data key")]
    Decryption,
    /// `body`: the opened body does not decode or fails `Body::check`.
    #[error("decrypted body is invalid: {0}")]
    Body(DecodeError),
    /// `key-fingerprint`: a SYNC's body names an application key other than its generation's.
    #[error("SYNC names application key {found}, but the key in force is {expected}")]
    KeyFingerprint {
        /// The fingerprint in the SYNC body.
        found: Hash256,
        /// The fingerprint of the record's key generation's application xpub.
        expected: Hash256,
    },
    /// `uncertified`: no certificate is known for the writer (certified capsules); the only
    /// reason a record may become valid later ([`Reason::wants_cert`]).
    #[error("writer {writer} of key generation {key_gen} has no certificate (held back for it, then refused)")]
    Uncertified {
        /// The record's writer.
        writer: u32,
        /// The record's key generation.
        key_gen: u32,
    },
    /// `cert-window`: the writer's certificate does not cover the record's epoch.
    #[error("writer {writer}'s certificate covers epochs {from}..{until}, not the record's epoch {epoch}")]
    CertWindow {
        /// The record's writer.
        writer: u32,
        /// The record's header epoch.
        epoch: u64,
        /// The certificate's `valid_from_epoch`.
        from: u64,
        /// The certificate's `valid_until_epoch` (exclusive).
        until: u64,
    },
    /// `revoked`: an installed revocation refuses the record (or, from `writer_key`, the signer).
    #[error("writer {writer} of key generation {key_gen} is revoked from epoch {from_epoch} or seq {from_seq}; the record is epoch {epoch}, seq {seq}")]
    Revoked {
        /// The revoked writer.
        writer: u32,
        /// The key generation of the revocation.
        key_gen: u32,
        /// The record's header epoch (from `writer_key`, which has no record: the revocation's
        /// `from_epoch`).
        epoch: u64,
        /// The record's seq (from `writer_key`: the revocation's `from_seq`).
        seq: u64,
        /// The revocation's `from_epoch`.
        from_epoch: u64,
        /// The revocation's `from_seq` (`u64::MAX`: no seq bound).
        from_seq: u64,
    },
    /// `certificate`: a Cert record carries a statement that fails its check, conflicts with an
    /// installed certificate, or does not fit a full table.
    #[error("Cert record carries a statement that is not accepted: {0}")]
    Certificate(CertError),
}

impl Reason {
    /// The check's stable name (`encoding`, `capsule`, `writer`, `key-generation`, ...), used
    /// by logs, metrics and audits.
    pub fn name(&self) -> &'static str {
        match self {
            Reason::Encoding(_) => "encoding",
            Reason::Capsule { .. } => "capsule",
            Reason::Writer(_) => "writer",
            Reason::KeyGeneration(_) => "key-generation",
            Reason::RetiredKey { .. } => "retired-key",
            Reason::KindNotAllowed { .. } => "kind",
            Reason::Structure(_) => "structure",
            Reason::Signature(_) => "signature",
            Reason::Decryption => "decryption",
            Reason::Body(_) => "body",
            Reason::KeyFingerprint { .. } => "key-fingerprint",
            Reason::Uncertified { .. } => "uncertified",
            Reason::CertWindow { .. } => "cert-window",
            Reason::Revoked { .. } => "revoked",
            Reason::Certificate(_) => "certificate",
        }
    }

    /// Whether the record may become valid once more is known (its writer's certificate has
    /// not arrived yet): the caller holds it back ([`Verifier::hold`]) rather than drop it.
    pub fn wants_cert(&self) -> bool {
        matches!(self, Reason::Uncertified { .. })
    }
}

/// A refused record, named as far as its bytes allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The record hash; `None` when the bytes did not decode.
    pub hash: Option<Hash256>,
    /// The header's writer index; `None` when the bytes did not decode.
    pub writer: Option<u32>,
    /// The header's seq; `None` when the bytes did not decode.
    pub seq: Option<u64>,
    /// The check that refused the record.
    pub reason: Reason,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.hash {
            Some(h) => write!(f, "record {h}")?,
            None => write!(f, "record (undecodable)")?,
        }
        if let (Some(w), Some(s)) = (self.writer, self.seq) {
            write!(f, " (writer {w}, seq {s})")?;
        }
        write!(f, ": {} check failed: {}", self.reason.name(), self.reason)
    }
}

impl std::error::Error for Rejected {}

/// Verifies records of one capsule. Holds the public metadata and, optionally, the data key;
/// without it, it checks everything but decryption (as a capsule server does).
pub struct Verifier {
    meta: SignedMetadata,
    data_key: Option<DataKey>,
    writer_keys: RwLock<HashMap<u32, VerifyingKey>>,
    /// Key generations 1.. (index `g - 1`), learnt from owner-signed rotation certificates.
    rotations: RwLock<Vec<Generation>>,
    /// How many rotations are installed: lets the common case (none) skip the lock.
    rotated: AtomicU32,
    /// Writer keys of generations 1.., by (generation, writer).
    rotated_keys: RwLock<HashMap<(u32, u32), VerifyingKey>>,
    /// Certificates and revocations of a certified capsule, by (generation, writer).
    certs: RwLock<CertTable>,
    /// Records waiting for their writer's certificate.
    held: Mutex<Held>,
    /// Held records refused to make room for newer ones.
    held_evicted: AtomicU64,
}

#[derive(Default)]
struct CertTable {
    certs: HashMap<(u32, u32), WriterCert>,
    /// Revocations by (generation, writer): a record is refused if any of them refuses it.
    revoked: HashMap<(u32, u32), Vec<Revocation>>,
}

/// Records held back for want of a certificate, by (generation, writer), oldest first.
#[derive(Default)]
struct Held {
    by_writer: HashMap<(u32, u32), HeldQueue>,
    total: usize,
    bytes: usize,
}

/// One writer's held records (stamped with the caller's clock), oldest first, and their bytes.
#[derive(Default)]
struct HeldQueue {
    records: VecDeque<(u64, Record)>,
    bytes: usize,
}

impl Held {
    /// Takes the oldest record of `id`, keeping the totals true.
    fn pop_oldest(&mut self, id: (u32, u32)) -> Option<Record> {
        let q = self.by_writer.get_mut(&id)?;
        let (_, r) = q.records.pop_front()?;
        let n = r.bytes().len();
        q.bytes -= n;
        self.total -= 1;
        self.bytes -= n;
        if q.records.is_empty() {
            self.by_writer.remove(&id);
        }
        Some(r)
    }
}

/// One rotated application key generation.
struct Generation {
    cert: RotationCert,
    app_key_fp: Hash256,
    data_key: Option<DataKey>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Verifier(capsule={}, can_open={})", self.meta.name().0.short(), self.data_key.is_some())
    }
}

impl Verifier {
    /// A verifier for the capsule of `meta` (whose owner signature was checked when it was
    /// decoded or signed), knowing generation 0 only. With `data_key` (generation 0's) it also
    /// opens and checks bodies; without, it checks everything else.
    pub fn new(meta: SignedMetadata, data_key: Option<DataKey>) -> Verifier {
        Verifier {
            meta,
            data_key,
            writer_keys: RwLock::new(HashMap::new()),
            rotations: RwLock::new(Vec::new()),
            rotated: AtomicU32::new(0),
            rotated_keys: RwLock::new(HashMap::new()),
            certs: RwLock::new(CertTable::default()),
            held: Mutex::new(Held::default()),
            held_evicted: AtomicU64::new(0),
        }
    }

    /// How this capsule's verifiers learn writer keys.
    pub fn writer_keys(&self) -> WriterKeys {
        self.meta.meta.policy.writer_keys
    }

    /// The application public key point of generation `key_gen` (what signs its statements).
    fn app_point(&self, key_gen: u32) -> Option<VerifyingKey> {
        if key_gen == 0 {
            return Some(self.meta.meta.app.point());
        }
        let gens = self.rotations.read().unwrap_or_else(|p| p.into_inner());
        gens.get(key_gen as usize - 1).map(|g| g.cert.app.point())
    }

    /// Checks a certificate or revocation against this capsule and its generation's application key.
    pub fn check_statement(&self, s: &KeyStatement) -> Result<(), CertError> {
        if self.writer_keys() != WriterKeys::Certified {
            return Err(CertError::NotCertified);
        }
        let point = self.app_point(s.key_gen()).ok_or(CertError::KeyGeneration(s.key_gen()))?;
        s.check(self.name(), &point)
    }

    /// Installs a certificate or revocation learnt out of band (the leader's key bundle, a
    /// file) or from a Cert record. Checked first; idempotent (`Ok(false)`: nothing new). A
    /// second, different certificate for the same (generation, writer) is refused: a writer's
    /// key changes with a new generation or a new writer index, never in place. A revocation
    /// is a no-op if an installed one already refuses everything it does (both bounds lower or
    /// equal); otherwise it is kept beside the others, up to [`REVOCATIONS_PER_WRITER_MAX`].
    pub fn install_statement(&self, s: &KeyStatement) -> Result<bool, CertError> {
        self.check_statement(s)?;
        let id = (s.key_gen(), s.writer());
        let mut t = self.certs.write().unwrap_or_else(|p| p.into_inner());
        match s {
            KeyStatement::Cert(c) => match t.certs.get(&id) {
                Some(old) if old == c => Ok(false),
                Some(_) => Err(CertError::Conflict { writer: c.writer, key_gen: c.key_gen }),
                None if t.certs.len() >= CERTIFIED_WRITERS_MAX => {
                    Err(CertError::TooMany { max: CERTIFIED_WRITERS_MAX })
                }
                None => {
                    t.certs.insert(id, c.clone());
                    Ok(true)
                }
            },
            KeyStatement::Revoke(r) => {
                let known = t.revoked.get(&id);
                // Nothing new if an installed one already refuses everything this one does.
                if known.is_some_and(|v| v.iter().any(|o| o.from_epoch <= r.from_epoch && o.from_seq <= r.from_seq)) {
                    return Ok(false);
                }
                if known.is_none() && t.revoked.len() >= CERTIFIED_WRITERS_MAX {
                    return Err(CertError::TooMany { max: CERTIFIED_WRITERS_MAX });
                }
                if known.is_some_and(|v| v.len() >= REVOCATIONS_PER_WRITER_MAX) {
                    return Err(CertError::TooMany { max: REVOCATIONS_PER_WRITER_MAX });
                }
                t.revoked.entry(id).or_default().push(r.clone());
                Ok(true)
            }
        }
    }

    /// Installs a role's own statements (its writers' certificates, as handed to it) and
    /// returns those refused, by writer, for the role to report: it runs on, but records signed
    /// under a refused certificate will be refused everywhere.
    pub fn install_own(&self, statements: &[KeyStatement]) -> Vec<(u32, CertError)> {
        statements.iter().filter_map(|s| self.install_statement(s).err().map(|e| (s.writer(), e))).collect()
    }

    /// Installs the statements of every Cert record among `records` (a whole file or store,
    /// where a record may come before its writer's certificate), without checking the carrying
    /// records: each statement carries the application key's own signature. Returns the
    /// statements refused, with the hash of the record that carried each. Nothing in a capsule
    /// that derives writer keys.
    pub fn learn_statements<'a>(&self, records: impl IntoIterator<Item = &'a Record>) -> Vec<(Hash256, CertError)> {
        let mut refused = Vec::new();
        if self.writer_keys() != WriterKeys::Certified {
            return refused;
        }
        let limits = &self.meta.meta.policy.limits;
        for rec in records {
            if rec.header().kind != Kind::Cert {
                continue;
            }
            if let Ok(Body::Certs(list)) = Body::decode(Kind::Cert, rec.body(), limits) {
                for st in &list {
                    if let Err(e) = self.install_statement(st) {
                        refused.push((rec.hash(), e));
                    }
                }
            }
        }
        refused
    }

    /// The certificates installed, by generation then writer.
    pub fn writer_certs(&self) -> Vec<WriterCert> {
        let t = self.certs.read().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<WriterCert> = t.certs.values().cloned().collect();
        v.sort_by_key(|c| (c.key_gen, c.writer));
        v
    }

    /// The revocations installed, by generation then writer.
    pub fn revocations(&self) -> Vec<Revocation> {
        let t = self.certs.read().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<Revocation> = t.revoked.values().flatten().cloned().collect();
        v.sort_by_key(|r| (r.key_gen, r.writer, r.from_epoch, r.from_seq));
        v
    }

    /// Holds back a record refused only for want of its writer's certificate ([`Reason::wants_cert`]),
    /// stamped with the caller's clock. Only a record that passes every check that needs no
    /// certificate is held ([`Verifier::check_before_hold`]: capsule, writer range, key
    /// generation, kind, structure, links); anything else is refused at once. The hold is
    /// bounded by count and by bytes, in total and per writer: when full, the oldest records of
    /// the same writer make room (or, failing that, this one is refused). Returns the records
    /// refused, for the caller to count.
    pub fn hold(&self, rec: Record, now_ms: u64) -> Vec<Rejected> {
        if let Err(r) = self.check_before_hold(&rec) {
            return vec![reject(&rec, r)];
        }
        let h = rec.header();
        let id = (h.key_gen, h.writer);
        let n = rec.bytes().len();
        if n > HELD_BYTES_PER_WRITER_MAX {
            return vec![uncertified(&rec)];
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut refused = Vec::new();
        loop {
            let q = held.by_writer.get(&id);
            let (q_len, q_bytes) = q.map_or((0, 0), |q| (q.records.len(), q.bytes));
            let full = q_len >= HELD_PER_WRITER_MAX
                || q_bytes + n > HELD_BYTES_PER_WRITER_MAX
                || held.total >= HELD_RECORDS_MAX
                || held.bytes + n > HELD_BYTES_MAX;
            if !full {
                break;
            }
            match held.pop_oldest(id) {
                Some(old) => refused.push(uncertified(&old)),
                None => {
                    refused.push(uncertified(&rec));
                    return refused;
                }
            }
        }
        let q = held.by_writer.entry(id).or_default();
        q.records.push_back((now_ms, rec));
        q.bytes += n;
        held.total += 1;
        held.bytes += n;
        refused
    }

    /// Takes the held records whose writer now has a certificate (or a revocation: they are then
    /// refused for it), for the caller to verify again by its usual path.
    pub fn release_held(&self) -> Vec<Record> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.total == 0 {
            return Vec::new();
        }
        let t = self.certs.read().unwrap_or_else(|p| p.into_inner());
        let ready: Vec<(u32, u32)> = held
            .by_writer
            .keys()
            .filter(|id| t.certs.contains_key(id) || t.revoked.contains_key(id))
            .copied()
            .collect();
        drop(t);
        let mut out = Vec::new();
        for id in ready {
            if let Some(q) = held.by_writer.remove(&id) {
                held.total -= q.records.len();
                held.bytes -= q.bytes;
                out.extend(q.records.into_iter().map(|(_, r)| r));
            }
        }
        out
    }

    /// Whether `h`'s writer is one this verifier cannot check yet: a certified capsule, no
    /// certificate or revocation known for (generation, writer), and not a Cert record (which
    /// may introduce its own writer). The cheap test before [`Verifier::hold`], so that the
    /// common path verifies a record without keeping a copy of it.
    pub fn needs_cert(&self, h: &Header) -> bool {
        if self.writer_keys() != WriterKeys::Certified || h.kind == Kind::Cert {
            return false;
        }
        let t = self.certs.read().unwrap_or_else(|p| p.into_inner());
        let id = (h.key_gen, h.writer);
        !t.certs.contains_key(&id) && !t.revoked.contains_key(&id)
    }

    /// Verifies and opens `rec`, or holds it back (`Ok(None)`) if its writer's certificate has
    /// not arrived ([`Verifier::needs_cert`]), stamped `now_ms`; a record the full hold cannot
    /// take is refused as uncertified. What every runtime's receive path does.
    pub fn verify_open_or_hold(&self, rec: Record, now_ms: u64) -> Result<Option<Verified<Opened>>, Rejected> {
        self.or_hold(rec, now_ms, Self::verify_open)
    }

    /// Like [`Verifier::verify_open_or_hold`] without opening the body (a capsule server).
    pub fn verify_or_hold(&self, rec: Record, now_ms: u64) -> Result<Option<Verified<Record>>, Rejected> {
        self.or_hold(rec, now_ms, Self::verify)
    }

    fn or_hold<T>(
        &self,
        rec: Record,
        now_ms: u64,
        verify: impl FnOnce(&Self, Record) -> Result<T, Rejected>,
    ) -> Result<Option<T>, Rejected> {
        if !self.needs_cert(rec.header()) {
            return verify(self, rec).map(Some);
        }
        let hash = rec.hash();
        // Only this record's own refusal is the caller's to report here; older records the
        // hold evicted to make room are counted with it (`held_evicted`).
        let mut refused = self.hold(rec, now_ms);
        match refused.iter().position(|r| r.hash == Some(hash)) {
            Some(i) => Err(refused.swap_remove(i)),
            None => {
                self.held_evicted.fetch_add(refused.len() as u64, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    /// Whether any record is held back for want of a certificate.
    pub fn holds_any(&self) -> bool {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).total > 0
    }

    /// Refuses held records older than [`CERT_WAIT_MS`] at `now_ms`, as uncertified.
    pub fn expire_held(&self, now_ms: u64) -> Vec<Rejected> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.total == 0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut freed = 0;
        for q in held.by_writer.values_mut() {
            while q.records.front().is_some_and(|(t, _)| now_ms.saturating_sub(*t) >= CERT_WAIT_MS) {
                let Some((_, r)) = q.records.pop_front() else { break };
                q.bytes -= r.bytes().len();
                freed += r.bytes().len();
                out.push(uncertified(&r));
            }
        }
        held.by_writer.retain(|_, q| !q.records.is_empty());
        held.total -= out.len();
        held.bytes -= freed;
        out
    }

    /// How many records are held back for want of a certificate.
    pub fn held_count(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    /// How many bytes (encoded records) are held back for want of a certificate.
    pub fn held_bytes(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    /// How many held records were refused to make room for newer ones (see [`Verifier::hold`]).
    pub fn held_evicted(&self) -> u64 {
        self.held_evicted.load(Ordering::Relaxed)
    }

    /// The apply-time check: what may have changed since `h`'s record was verified, possibly on
    /// another thread before this verifier learnt it. A record verified, then held (by an
    /// orderer, a hold-back, a queue), is refused when it is applied or stored if, by then, its
    /// key generation is retired at its epoch or a revocation of its writer refuses its epoch
    /// or seq. Every place that applies or stores records calls this; it costs one atomic load,
    /// plus a read-locked table lookup in a certified capsule.
    pub fn recheck(&self, h: &Header) -> Result<(), Reason> {
        if let Some(r) = self.retired(h) {
            return Err(r);
        }
        self.revoked(h).map_or(Ok(()), Err)
    }

    /// Whether a heads hint that writer `writer` has records from `next_seq` on can only be
    /// about records a revocation refuses (its seq bound, under the generation in force now):
    /// then there is nothing worth asking for.
    pub fn hint_refused(&self, writer: u32, next_seq: u64) -> bool {
        self.writer_keys() == WriterKeys::Certified
            && self
                .revoked_at(self.key_gen_newest(), writer, 0, next_seq)
                .is_some_and(|r| matches!(r, Reason::Revoked { from_seq, .. } if next_seq >= from_seq))
    }

    /// Whether a revocation installed here refuses `h` (its writer, generation, epoch, seq).
    pub fn revoked(&self, h: &Header) -> Option<Reason> {
        if self.writer_keys() != WriterKeys::Certified {
            return None;
        }
        self.revoked_at(h.key_gen, h.writer, h.epoch, h.seq)
    }

    /// Whether a revocation installed here refuses a record of (`key_gen`, `writer`) at `epoch`
    /// and `seq`. `epoch` may be 0 to ask about the seq bound alone (a heads hint, which names no
    /// epoch, only refuses what the seq bound covers from then on).
    pub fn revoked_at(&self, key_gen: u32, writer: u32, epoch: u64, seq: u64) -> Option<Reason> {
        let t = self.certs.read().unwrap_or_else(|p| p.into_inner());
        let r = t.revoked.get(&(key_gen, writer))?.iter().find(|r| r.refuses(epoch, seq))?;
        Some(Reason::Revoked { writer, key_gen, epoch, seq, from_epoch: r.from_epoch, from_seq: r.from_seq })
    }

    /// The capsule's signed metadata this verifier checks against.
    pub fn metadata(&self) -> &SignedMetadata {
        &self.meta
    }

    /// The name of the capsule this verifier accepts records of.
    pub fn name(&self) -> CapsuleName {
        self.meta.name()
    }

    /// Whether the verifier holds generation 0's data key, and so opens and checks bodies.
    pub fn can_open(&self) -> bool {
        self.data_key.is_some()
    }

    /// Whether `key` is this capsule's data key (by its fingerprint in the metadata).
    pub fn data_key_matches(&self, key: &DataKey) -> bool {
        key.fingerprint() == self.meta.meta.policy.data_key_fp
    }

    /// The public key of writer `w` of generation 0: derived from the application public key
    /// (cached), or, in a certified capsule, its certificate's; a revoked writer has none (this
    /// key verifies acks and CapsuleDB's answers, which carry no epoch).
    pub fn writer_key(&self, w: u32) -> Result<VerifyingKey, Reason> {
        if self.writer_keys() == WriterKeys::Certified {
            let t = self.certs.read().unwrap_or_else(|p| p.into_inner());
            // Acks and CapsuleDB's answers carry no epoch: a revoked writer's count for nothing
            // from when this verifier knows the revocation.
            if let Some(r) = t.revoked.get(&(0, w)).and_then(|v| v.first()) {
                return Err(Reason::Revoked {
                    writer: w,
                    key_gen: 0,
                    epoch: r.from_epoch,
                    seq: r.from_seq,
                    from_epoch: r.from_epoch,
                    from_seq: r.from_seq,
                });
            }
            return t.certs.get(&(0, w)).map(|c| c.key).ok_or(Reason::Uncertified { writer: w, key_gen: 0 });
        }
        if let Some(k) = self.writer_keys.read().unwrap_or_else(|p| p.into_inner()).get(&w) {
            return Ok(*k);
        }
        let k = self.meta.meta.app.writer(w).map_err(|_| Reason::Writer(w))?;
        self.writer_keys.write().unwrap_or_else(|p| p.into_inner()).insert(w, k);
        Ok(k)
    }

    /// The newest application key generation this verifier knows (0: never rotated).
    pub fn key_gen_newest(&self) -> u32 {
        self.rotated.load(Ordering::Acquire)
    }

    /// The rotation certificates installed, oldest first (generation 1, 2, ...).
    pub fn rotation_certs(&self) -> Vec<RotationCert> {
        self.rotations.read().unwrap_or_else(|p| p.into_inner()).iter().map(|g| g.cert.clone()).collect()
    }

    /// Installs an owner-signed rotation certificate (and, for a verifier that opens bodies, the
    /// new generation's data key, handed over by the leader on an attested channel). Idempotent:
    /// returns `Ok(false)` when nothing new was learnt. A generation's data key may come after
    /// its certificate (the certificate from the log, the key from the leader).
    pub fn install_rotation(&self, cert: &RotationCert, data_key: Option<DataKey>) -> Result<bool, RotationError> {
        cert.check(&self.meta)?;
        if data_key.as_ref().is_some_and(|k| k.fingerprint() != cert.data_key_fp) {
            return Err(RotationError::DataKey);
        }
        let mut gens = self.rotations.write().unwrap_or_else(|p| p.into_inner());
        let newest = gens.len() as u32;
        if cert.key_gen <= newest {
            let g = &mut gens[cert.key_gen as usize - 1];
            if g.cert != *cert {
                return Err(RotationError::Conflict(cert.key_gen));
            }
            if g.data_key.is_none() && data_key.is_some() {
                g.data_key = data_key;
                return Ok(true);
            }
            return Ok(false);
        }
        if cert.key_gen != newest + 1 {
            return Err(RotationError::Generation { found: cert.key_gen, newest });
        }
        if newest + 1 >= KEY_GENERATIONS_MAX {
            return Err(RotationError::TooMany);
        }
        let previous = gens.last().map(|g| g.cert.from_epoch).unwrap_or(0);
        if cert.from_epoch <= previous {
            return Err(RotationError::Epoch { found: cert.from_epoch, previous });
        }
        if gens.iter().any(|g| g.cert.app_index == cert.app_index) {
            return Err(RotationError::AppIndex(cert.app_index));
        }
        gens.push(Generation { cert: cert.clone(), app_key_fp: cert.app.fingerprint(), data_key });
        self.rotated.store(newest + 1, Ordering::Release);
        Ok(true)
    }

    /// Whether `h`'s key generation is retired at `h.epoch` (a newer generation is in force):
    /// the cheap check a node runs before any signature (see `NodeCore::precheck`).
    pub fn retired(&self, h: &Header) -> Option<Reason> {
        if self.rotated.load(Ordering::Acquire) <= h.key_gen {
            return None;
        }
        let gens = self.rotations.read().unwrap_or_else(|p| p.into_inner());
        let next = gens.get(h.key_gen as usize)?;
        (h.epoch >= next.cert.from_epoch).then_some(Reason::RetiredKey {
            key_gen: h.key_gen,
            epoch: h.epoch,
            retired_from: next.cert.from_epoch,
        })
    }

    /// The application key generation in force at `epoch`.
    pub fn key_gen_at(&self, epoch: u64) -> u32 {
        if self.rotated.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let gens = self.rotations.read().unwrap_or_else(|p| p.into_inner());
        gens.iter().rev().find(|g| g.cert.from_epoch <= epoch).map(|g| g.cert.key_gen).unwrap_or(0)
    }

    /// The fingerprint of generation `key_gen`'s application public key.
    pub fn app_key_fp(&self, key_gen: u32) -> Option<Hash256> {
        if key_gen == 0 {
            return Some(self.meta.meta.app.fingerprint());
        }
        let gens = self.rotations.read().unwrap_or_else(|p| p.into_inner());
        gens.get(key_gen as usize - 1).map(|g| g.app_key_fp)
    }

    /// The key window check: `h.key_gen` is known and in force at `h.epoch`.
    fn check_generation(&self, h: &Header) -> Result<(), Reason> {
        if h.key_gen == 0 {
            return self.retired(h).map_or(Ok(()), Err);
        }
        if h.key_gen > self.rotated.load(Ordering::Acquire) {
            return Err(Reason::KeyGeneration(h.key_gen));
        }
        let gens = self.rotations.read().unwrap_or_else(|p| p.into_inner());
        let g = &gens[h.key_gen as usize - 1];
        if h.epoch < g.cert.from_epoch {
            return Err(Reason::KeyGeneration(h.key_gen));
        }
        if let Some(next) = gens.get(h.key_gen as usize) {
            if h.epoch >= next.cert.from_epoch {
                return Err(Reason::RetiredKey {
                    key_gen: h.key_gen,
                    epoch: h.epoch,
                    retired_from: next.cert.from_epoch,
                });
            }
        }
        Ok(())
    }

    /// The public key of writer `w` under key generation `key_gen`.
    pub fn writer_key_gen(&self, key_gen: u32, w: u32) -> Result<VerifyingKey, Reason> {
        if self.writer_keys() == WriterKeys::Certified {
            let t = self.certs.read().unwrap_or_else(|p| p.into_inner());
            return t.certs.get(&(key_gen, w)).map(|c| c.key).ok_or(Reason::Uncertified { writer: w, key_gen });
        }
        if key_gen == 0 {
            return self.writer_key(w);
        }
        if let Some(k) = self.rotated_keys.read().unwrap_or_else(|p| p.into_inner()).get(&(key_gen, w)) {
            return Ok(*k);
        }
        let app = {
            let gens = self.rotations.read().unwrap_or_else(|p| p.into_inner());
            gens.get(key_gen as usize - 1).map(|g| g.cert.app).ok_or(Reason::KeyGeneration(key_gen))?
        };
        let k = app.writer(w).map_err(|_| Reason::Writer(w))?;
        let mut cache = self.rotated_keys.write().unwrap_or_else(|p| p.into_inner());
        // Bounded: writers are bounded per capsule by the fabric, generations by
        // KEY_GENERATIONS_MAX; clear rather than grow past a large bound.
        if cache.len() >= 1 << 16 {
            cache.clear();
        }
        cache.insert((key_gen, w), k);
        Ok(k)
    }

    /// Decodes and verifies raw bytes.
    pub fn verify_bytes(&self, bytes: &[u8]) -> Result<Verified<Record>, Rejected> {
        let rec = Record::decode(bytes, &self.meta.meta.policy.limits).map_err(|e| Rejected {
            hash: None,
            writer: None,
            seq: None,
            reason: Reason::Encoding(e),
        })?;
        self.verify(rec)
    }

    /// Verifies a decoded record: capsule, writer, key generation, kind, structure, signature,
    /// and, when this verifier holds the data key, decryption and the body.
    pub fn verify(&self, rec: Record) -> Result<Verified<Record>, Rejected> {
        if self.data_key.is_some() {
            return self.verify_open(rec).map(|o| o.split().0);
        }
        self.check_public(&rec)?;
        Ok(Verified(rec))
    }

    /// Like [`Verifier::verify`], and returns the decrypted body. Needs the data key.
    pub fn verify_open(&self, rec: Record) -> Result<Verified<Opened>, Rejected> {
        self.check_public(&rec)?;
        let body = self.open_body(&rec).map_err(|reason| reject(&rec, reason))?;
        Ok(Verified(Opened { record: rec, body }))
    }

    /// Opens a record reached through a hash pointer that an already verified record holds
    /// (CapsuleDB: a db-index names each block by its record hash). The record's hash must equal
    /// `expected`; its signature is NOT checked again: the record hash commits to the header and
    /// to the body's digest, so by SHA-256's collision resistance these bytes are the ones the
    /// pointer's signer named, and the signature they carried was checked by whoever may
    /// vouch for it (the writer that made the pointer). The capsule name is checked, then the
    /// body is decrypted (the AEAD authenticates it under the data key) and checked like any body.
    /// Returns only the body: the record is not `Verified` for any other use.
    pub fn open_pinned(&self, rec: &Record, expected: &Hash256) -> Result<Body, Rejected> {
        if rec.hash() != *expected {
            return Err(reject(rec, Reason::Structure("record hash differs from the verified pointer")));
        }
        if rec.header().capsule != self.meta.name() {
            return Err(reject(rec, Reason::Capsule { found: rec.header().capsule.0 }));
        }
        self.open_body(rec).map_err(|reason| reject(rec, reason))
    }

    /// Decrypts a record that has already been verified.
    pub fn open(&self, rec: &Verified<Record>) -> Result<Body, Rejected> {
        self.open_body(rec).map_err(|reason| reject(rec, reason))
    }

    fn open_body(&self, rec: &Record) -> Result<Body, Reason> {
        let h = rec.header();
        let limits = &self.meta.meta.policy.limits;
        if h.kind.is_public() {
            return Body::decode(h.kind, rec.body(), limits).map_err(Reason::Body);
        }
        let key = self.data_key.as_ref().ok_or(Reason::Decryption)?;
        let ctx = Record::seal_context(&h.capsule, h.writer, h.seq);
        let plain = if h.key_gen == 0 {
            key.open(&h.salt, &ctx, rec.header_bytes(), rec.body())
        } else {
            // A rotated generation's body is sealed with that generation's data key.
            let gens = self.rotations.read().unwrap_or_else(|p| p.into_inner());
            let key = gens.get(h.key_gen as usize - 1).and_then(|g| g.data_key.as_ref()).ok_or(Reason::Decryption)?;
            key.open(&h.salt, &ctx, rec.header_bytes(), rec.body())
        }
        .map_err(|_| Reason::Decryption)?;
        let body = Body::decode(h.kind, &plain, limits).map_err(Reason::Body)?;
        body.check(limits, h.lamport).map_err(Reason::Body)?;
        if let Body::Sync { app_key_fp } = &body {
            // A SYNC names the application key in force at its epoch: its own generation's.
            let expected = self.app_key_fp(h.key_gen).ok_or(Reason::KeyGeneration(h.key_gen))?;
            if *app_key_fp != expected {
                return Err(Reason::KeyFingerprint { found: *app_key_fp, expected });
            }
        }
        Ok(body)
    }

    /// Every check of a record that needs no writer key: capsule, writer range, key generation
    /// in force at its epoch, kind allowed for its writer, chain structure, links. Run before a
    /// record is held for its certificate, so that the hold keeps only records that a
    /// certificate could still make valid.
    pub fn check_before_hold(&self, rec: &Record) -> Result<(), Reason> {
        let h = rec.header();
        if h.capsule != self.meta.name() {
            return Err(Reason::Capsule { found: h.capsule.0 });
        }
        if h.writer >= 1 << 31 || crate::server_id(h.writer).is_some() {
            // Capsule servers' keys sign acks only, never records: a server (or its stolen
            // key) must not be able to write.
            return Err(Reason::Writer(h.writer));
        }
        self.check_generation(h)?;
        let policy = &self.meta.meta.policy;
        let coordinator = policy.coordinator;
        if h.kind == Kind::Sync && !policy.is_coordinator(h.writer) {
            return Err(Reason::KindNotAllowed { kind: "sync", coordinator });
        }
        if (h.seq == 0) != h.prev.is_zero() {
            return Err(Reason::Structure("seq 0 must have a zero prev, and every later seq a non-zero one"));
        }
        if h.kind == Kind::Data && h.links.iter().any(|l| !policy.is_coordinator(l.writer)) {
            return Err(Reason::Structure("a data record may link only to coordinators' records (its epoch's SYNC)"));
        }
        if self.writer_keys() == WriterKeys::Certified {
            if let Some(r) = self.revoked(h) {
                return Err(r);
            }
        }
        Ok(())
    }

    fn check_public(&self, rec: &Record) -> Result<(), Rejected> {
        let h = rec.header();
        let fail = |reason| Err(reject(rec, reason));
        self.check_before_hold(rec).map_err(|r| reject(rec, r))?;
        if self.writer_keys() == WriterKeys::Certified {
            return self.check_certified(rec);
        }
        if h.kind == Kind::Cert {
            return fail(Reason::Structure("Cert records belong only to capsules that certify writers"));
        }
        let key = self.writer_key_gen(h.key_gen, h.writer).map_err(|r| reject(rec, r))?;
        if key.verify(&rec.hash(), &rec.signature()).is_err() {
            return fail(Reason::Signature(h.writer));
        }
        Ok(())
    }

    /// The signature check of a certified capsule: the writer's certificate (one table lookup
    /// under a read lock, the same cost as a derived key's cache) must cover the record's epoch
    /// (revocations were checked before, in [`Verifier::check_before_hold`]); then the signature. A Cert record's statements are checked too,
    /// may introduce the record's own writer, and are installed once the record verifies.
    fn check_certified(&self, rec: &Record) -> Result<(), Rejected> {
        let h = rec.header();
        let id = (h.key_gen, h.writer);
        let known = {
            let t = self.certs.read().unwrap_or_else(|p| p.into_inner());
            // Only what the check needs: no copy of the certificate on the per-record path.
            t.certs.get(&id).map(|c| (c.key, c.valid_from_epoch, c.valid_until_epoch))
        };
        let statements = if h.kind == Kind::Cert {
            let limits = &self.meta.meta.policy.limits;
            let list = match Body::decode(Kind::Cert, rec.body(), limits) {
                Ok(Body::Certs(list)) => list,
                Ok(_) => return Err(reject(rec, Reason::Structure("a Cert record's body is a statement list"))),
                Err(e) => return Err(reject(rec, Reason::Body(e))),
            };
            for s in &list {
                if let Err(e) = self.check_statement(s) {
                    return Err(reject(rec, Reason::Certificate(e)));
                }
            }
            list
        } else {
            Vec::new()
        };
        // A writer unknown so far may introduce itself with its own certificate.
        let cert = known.or_else(|| {
            statements.iter().find_map(|s| match s {
                KeyStatement::Cert(c) if (c.key_gen, c.writer) == id => {
                    Some((c.key, c.valid_from_epoch, c.valid_until_epoch))
                }
                _ => None,
            })
        });
        let Some((key, from, until)) = cert else {
            return Err(reject(rec, Reason::Uncertified { writer: h.writer, key_gen: h.key_gen }));
        };
        if !(from <= h.epoch && h.epoch < until) {
            return Err(reject(rec, Reason::CertWindow { writer: h.writer, epoch: h.epoch, from, until }));
        }
        if key.verify(&rec.hash(), &rec.signature()).is_err() {
            return Err(reject(rec, Reason::Signature(h.writer)));
        }
        // All or nothing: a statement that would conflict refuses the record before any is kept.
        {
            let t = self.certs.read().unwrap_or_else(|p| p.into_inner());
            for s in &statements {
                if let KeyStatement::Cert(c) = s {
                    if t.certs.get(&(c.key_gen, c.writer)).is_some_and(|old| old != c) {
                        let e = CertError::Conflict { writer: c.writer, key_gen: c.key_gen };
                        return Err(reject(rec, Reason::Certificate(e)));
                    }
                }
            }
        }
        for s in &statements {
            if let Err(e) = self.install_statement(s) {
                return Err(reject(rec, Reason::Certificate(e)));
            }
        }
        Ok(())
    }
}

fn uncertified(rec: &Record) -> Rejected {
    let h = rec.header();
    reject(rec, Reason::Uncertified { writer: h.writer, key_gen: h.key_gen })
}

fn reject(rec: &Record, reason: Reason) -> Rejected {
    let h = rec.header();
    Rejected { hash: Some(rec.hash()), writer: Some(h.writer), seq: Some(h.seq), reason }
}
