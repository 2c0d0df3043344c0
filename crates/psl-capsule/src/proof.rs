//! Membership proofs: evidence, checkable with public keys alone, that a record belongs to a
//! capsule's history as fixed by a signed head (a later record of the writer, or a SYNC).
//!
//! A proof carries the owner-signed metadata (the trust anchor, named by the capsule name), the
//! head's signature, and a path of steps from the head down to the target. Each step is a record
//! header plus its body length and body digest: enough to recompute the record hash without the
//! body. Step `i + 1`'s hash must appear among step `i`'s pointers (`prev` or a link), and the
//! pointer must be one the [`crate::Verifier`] lets a record of step `i`'s kind and writer hold
//! (see [`MembershipProof::verify`] for the rules). Only the head's signature is in the proof, so
//! the head's signer vouches for every step below it: a head may therefore be a coordinator's
//! SYNC (which vouches for any writer's record it reaches) or a record of the target's own
//! writer (which vouches for that writer's chain only), and never a record of a capsule
//! server's key, which signs acks and never records ([`crate::SERVER_WRITER_BASE`]).

use crate::body::Body;
use crate::certs::{CertError, KeyStatement, WriterCert, WRITER_CERT_LEN};
use crate::codec::{DecodeError, Put, Reader};
use crate::meta::WriterKeys;
use crate::meta::{CapsuleName, MetadataError, Policy, SignedMetadata};
use crate::record::{record_hash, Header, Kind, Link, HEADER_FIXED_LEN, LINK_LEN};
use crate::replica::Replica;
use psl_crypto::{Hash256, Signature};
use std::collections::{HashMap, VecDeque};

const PROOF_MAGIC: &[u8; 4] = b"PSLP";
/// Version 1: capsules with derived writer keys. Version 2 (certified capsules) carries the head
/// writer's certificate after the head signature.
const PROOF_VERSION: u8 = 2;
/// Most steps a proof may hold (a path longer than this is refused on decode).
pub const PROOF_STEPS_MAX: u32 = 1 << 20;

/// One record on a proof's path, without its body: enough to recompute its record hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProofStep {
    /// The record's exact header bytes (at most `116 + 44 × links_per_record_max`).
    pub header: Vec<u8>,
    /// Length of the record's body as stored (sealed), in bytes.
    pub body_len: u32,
    /// SHA-256 of the record's body as stored (sealed; clear for a Cert record).
    pub body_digest: Hash256,
}

/// A path of record headers from a signed head down to a target record, with the capsule's
/// signed metadata as trust anchor; checkable with public keys alone ([`MembershipProof::verify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipProof {
    /// The capsule's owner-signed metadata; its name is the capsule the proof is about.
    pub metadata: SignedMetadata,
    /// The head writer's signature over the head's record hash (step 0); the only signature
    /// in the proof.
    pub head_signature: Signature,
    /// The head writer's certificate, in a capsule that certifies writers (its public key is not
    /// derivable). A proof shows the head was signed by a certified writer; whether that writer
    /// was revoked before the head's epoch is a question for the log, which carries revocations.
    pub head_cert: Option<WriterCert>,
    /// `steps[0]` is the signed head, the last step is the target.
    pub steps: Vec<ProofStep>,
}

/// What a valid proof establishes: `target` is in `capsule`'s history as fixed by `head`, whose
/// writer signed it and so vouches for the target (a coordinator, when `head_kind` is SYNC;
/// otherwise the target's own writer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProofOutcome {
    /// The capsule named by the proof's metadata (equal to the expected name, if one was given).
    pub capsule: CapsuleName,
    /// The signed head (step 0).
    pub head: Link,
    /// The head record's kind: SYNC (a coordinator vouches for any writer) or another kind (the
    /// target's own writer vouches).
    pub head_kind: Kind,
    /// The record proved (the last step).
    pub target: Link,
}

/// Why a membership proof cannot be built, decoded or verified. Step numbers count from 0, the head.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The proof, or one of its step headers, does not decode.
    #[error("proof encoding: {0}")]
    Decode(#[from] DecodeError),
    /// The proof's metadata does not decode or its owner signature does not verify.
    #[error("proof metadata: {0}")]
    Metadata(#[from] MetadataError),
    /// The proof is about another capsule than the one the caller expects.
    #[error("proof is for capsule {found}, expected {expected}")]
    Capsule {
        /// The capsule name the caller trusts.
        expected: CapsuleName,
        /// The capsule name of the proof's metadata.
        found: CapsuleName,
    },
    /// The proof has no step, so no head and no target.
    #[error("proof has no steps")]
    Empty,
    /// This step's header names another capsule.
    #[error("step {0} belongs to another capsule")]
    StepCapsule(usize),
    /// This step's key generation is not 0, its writer is 2^31 or more, or `seq = 0` does not
    /// match a zero `prev`.
    #[error("step {0} breaks a structural rule (key generation other than 0, writer index at or above 2^31, or prev inconsistent with seq)")]
    StepStructure(usize),
    /// The head signature does not verify over the head's record hash under this writer's key
    /// (or, in a derived capsule, the key cannot be derived).
    #[error("head signature does not verify under writer {0}'s key")]
    HeadSignature(u32),
    /// Neither the previous step's `prev` nor any of its links points at this step.
    #[error("step {step} ({hash}) is not pointed at by step {}", step - 1)]
    Unlinked {
        /// The step that is not pointed at.
        step: usize,
        /// Its record hash.
        hash: Hash256,
    },
    /// Building: the target record is not in the replica.
    #[error("target {0} is not in the replica")]
    UnknownTarget(Hash256),
    /// Building: the head the caller chose is not in the replica.
    #[error("head {0} is not in the replica")]
    UnknownHead(Hash256),
    /// Building: no allowed chain of pointers leads from any candidate head to the target.
    #[error("no chain of pointers leads from head {head} to target {target}")]
    NoPath {
        /// The first head tried.
        head: Hash256,
        /// The target record.
        target: Hash256,
    },
    /// Certified capsule: the proof has no head certificate, or it does not name the head's
    /// writer and generation 0 or cover the head's epoch (building: none in the replica's Cert
    /// records); derived capsule: the proof carries one. Carries the head's writer.
    #[error("head writer {0} has no certificate in the replica (a certified capsule's proof carries one)")]
    NoHeadCert(u32),
    /// The head certificate fails its check (capsule, writer index, or the signature of the
    /// metadata's application key).
    #[error("head certificate: {0}")]
    HeadCert(#[from] CertError),
    /// A step is signed with a capsule server's key (writers `2^15 .. 2^16`), which signs acks only.
    #[error("step {step} is by writer {writer}, a capsule server's key (servers sign acks, never records; step 0 is the head)")]
    ServerWriter {
        /// The offending step.
        step: usize,
        /// Its writer index.
        writer: u32,
    },
    /// A step is a SYNC by a writer that is not one of the policy's coordinators.
    #[error("step {step} is a SYNC by writer {writer}, which is not one of the policy's coordinators")]
    SyncWriter {
        /// The offending step.
        step: usize,
        /// Its writer index.
        writer: u32,
    },
    /// A step is reached by a link that the verifier would refuse in a record of the previous
    /// step's kind (a data record may link only to the SYNC of its own epoch).
    #[error("step {step} is reached from step {} by a link the verifier refuses: {rule}", step - 1)]
    LinkNotAllowed {
        /// The step reached.
        step: usize,
        /// The rule the link breaks.
        rule: &'static str,
    },
    /// The head is neither a SYNC nor a record of the target's writer, so its signer cannot
    /// vouch for the target.
    #[error("a {} record of writer {head_writer} cannot head a proof of writer {target_writer}'s record: only a coordinator's SYNC vouches for other writers", head_kind.name())]
    HeadCannotVouch {
        /// The head's writer.
        head_writer: u32,
        /// The head's kind (not SYNC).
        head_kind: Kind,
        /// The target's writer.
        target_writer: u32,
    },
}

impl MembershipProof {
    /// Builds a proof that `target` is in `replica`. With no `head`, picks the newest SYNC that
    /// reaches the target, else the newest record of the target's writer. The path follows only
    /// pointers that [`MembershipProof::verify`] accepts. A given `head` must be able to head a
    /// proof of `target` (a coordinator's SYNC, or a record of the target's writer; never a
    /// capsule server's): else `ServerWriter` or `SyncWriter`, or, once a path is found,
    /// `HeadCannotVouch` (`NoPath` when there is no path at all).
    pub fn build(
        metadata: &SignedMetadata,
        replica: &Replica,
        target: Hash256,
        head: Option<Hash256>,
    ) -> Result<MembershipProof, ProofError> {
        let t = replica.get(&target).ok_or(ProofError::UnknownTarget(target))?;
        let policy = &metadata.meta.policy;
        let explicit = head;
        let candidates: Vec<Hash256> = match head {
            Some(h) => {
                let hr = replica.get(&h).ok_or(ProofError::UnknownHead(h))?;
                check_step_alone(policy, 0, hr.header())?;
                vec![h]
            }
            None => {
                let mut syncs: Vec<_> = replica.iter().filter(|r| r.header().kind == Kind::Sync).collect();
                syncs.sort_by_key(|r| std::cmp::Reverse((r.header().epoch, r.header().seq)));
                let mut c: Vec<Hash256> = syncs.iter().map(|r| r.hash()).collect();
                if let Some(hd) = replica.heads().get(&t.header().writer) {
                    c.push(hd.hash);
                }
                c.push(target);
                c
            }
        };
        for head in &candidates {
            let Some(head_rec) = replica.get(head) else { continue };
            let hh = head_rec.header();
            let vouches = check_head_vouches(hh, t.header().writer);
            if check_step_alone(policy, 0, hh).is_err() || (explicit.is_none() && vouches.is_err()) {
                continue;
            }
            if let Some(path) = shortest_path(policy, replica, *head, target) {
                // A head the caller chose: there is a path, but the head cannot vouch for it.
                vouches?;
                let steps = path
                    .iter()
                    .map(|h| {
                        let r = replica.get(h).expect("path nodes are in the replica");
                        ProofStep {
                            header: r.header_bytes().to_vec(),
                            body_len: r.body_len(),
                            body_digest: r.body_digest(),
                        }
                    })
                    .collect();
                let head_cert = match metadata.meta.policy.writer_keys {
                    WriterKeys::Derived => None,
                    WriterKeys::Certified => Some(
                        cert_in(metadata, replica, head_rec.header().writer)
                            .ok_or(ProofError::NoHeadCert(head_rec.header().writer))?,
                    ),
                };
                return Ok(MembershipProof {
                    metadata: metadata.clone(),
                    head_signature: head_rec.signature(),
                    head_cert,
                    steps,
                });
            }
        }
        Err(ProofError::NoPath { head: candidates[0], target })
    }

    /// Checks the proof with public keys only. `expected` is the capsule name the caller trusts.
    ///
    /// What is checked, on headers alone (the verifier's own rules, as far as a header shows
    /// them; see `docs/formats/datacapsule.md` §8):
    /// - every step: this capsule; key generation 0; `seq = 0` exactly when `prev` is zero; a
    ///   writer below 2^31 and outside the capsule servers' range ([`crate::server_id`]: servers
    ///   sign acks, never records); a SYNC only by one of the policy's coordinators;
    /// - the head (step 0): its signature under the writer's key (derived, or from the head
    ///   certificate in a certified capsule, which must name the writer, generation 0 and cover
    ///   the head's epoch);
    /// - each later step is pointed at by the step before it, either by `prev` (same writer,
    ///   seq one less) or by a link naming its (writer, seq, hash) that a record of the holder's
    ///   kind may carry: a data record links only to the SYNC of its own epoch (by a
    ///   coordinator); a SYNC (by a coordinator) links to any writer's record; control, CapsuleDB
    ///   and Cert records link to any writer's record (an EOE names other writers' heads);
    /// - which records may head a proof: a coordinator's SYNC heads a proof of any writer's
    ///   record; any other record (of any kind, a coordinator's included) heads proofs of its
    ///   own writer's records only, since its signer vouches for nothing of another writer's.
    ///
    /// The outcome names the head (writer, seq, hash, kind) and the target: whoever relies on a
    /// proof should look at who signed its head.
    pub fn verify(&self, expected: Option<CapsuleName>) -> Result<ProofOutcome, ProofError> {
        let capsule = self.metadata.name();
        if let Some(e) = expected {
            if e != capsule {
                return Err(ProofError::Capsule { expected: e, found: capsule });
            }
        }
        let policy = &self.metadata.meta.policy;
        let limits = &policy.limits;
        let mut prev: Option<(Header, Hash256)> = None;
        let mut head = None;
        for (i, s) in self.steps.iter().enumerate() {
            let h = Header::decode(&s.header, limits)?;
            if h.capsule != capsule {
                return Err(ProofError::StepCapsule(i));
            }
            check_step_alone(policy, i, &h)?;
            let hash = record_hash(&s.header, s.body_len, &s.body_digest);
            match &prev {
                None => {
                    let key = match (&self.head_cert, policy.writer_keys) {
                        (None, WriterKeys::Derived) => {
                            self.metadata.meta.app.writer(h.writer).map_err(|_| ProofError::HeadSignature(h.writer))?
                        }
                        (Some(c), WriterKeys::Certified) => {
                            c.check(capsule, &self.metadata.meta.app.point())?;
                            if c.writer != h.writer || c.key_gen != 0 || !c.covers(h.epoch) {
                                return Err(ProofError::NoHeadCert(h.writer));
                            }
                            c.key
                        }
                        _ => return Err(ProofError::NoHeadCert(h.writer)),
                    };
                    key.verify(&hash, &self.head_signature).map_err(|_| ProofError::HeadSignature(h.writer))?;
                    head = Some((Link { writer: h.writer, seq: h.seq, hash }, h.kind));
                }
                Some((ph, _)) => match pointer(policy, ph, &h, &hash) {
                    Pointer::Allowed => {}
                    Pointer::Refused(rule) => return Err(ProofError::LinkNotAllowed { step: i, rule }),
                    Pointer::None => return Err(ProofError::Unlinked { step: i, hash }),
                },
            }
            prev = Some((h, hash));
        }
        let (th, thash) = prev.ok_or(ProofError::Empty)?;
        let (head, head_kind) = head.ok_or(ProofError::Empty)?;
        if head_kind != Kind::Sync && head.writer != th.writer {
            return Err(ProofError::HeadCannotVouch { head_writer: head.writer, head_kind, target_writer: th.writer });
        }
        Ok(ProofOutcome { capsule, head, head_kind, target: Link { writer: th.writer, seq: th.seq, hash: thash } })
    }

    /// The proof's bytes: version 2 when it carries a head certificate, else version 1.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(PROOF_MAGIC);
        b.put_u8(if self.head_cert.is_some() { 2 } else { 1 });
        b.extend_from_slice(&self.metadata.encode());
        b.extend_from_slice(&self.head_signature.0);
        if let Some(c) = &self.head_cert {
            b.extend_from_slice(&c.encode());
        }
        b.put_u32(self.steps.len() as u32);
        for s in &self.steps {
            b.put_u32(s.header.len() as u32);
            b.extend_from_slice(&s.header);
            b.put_u32(s.body_len);
            b.extend_from_slice(&s.body_digest.0);
        }
        b
    }

    /// Decodes a proof (checking the metadata signature, not yet the path).
    pub fn decode(bytes: &[u8]) -> Result<MembershipProof, ProofError> {
        let mut r = Reader::new(bytes);
        if &r.array::<4>("proof magic")? != PROOF_MAGIC {
            return Err(DecodeError::Magic { what: "proof" }.into());
        }
        let v = r.u8("proof version")?;
        if v != 1 && v != PROOF_VERSION {
            return Err(DecodeError::Version { what: "proof", found: v, supported: PROOF_VERSION }.into());
        }
        let mlen = SignedMetadata::encoded_len(&bytes[r.pos()..])?;
        let metadata = SignedMetadata::decode(r.take(mlen, "proof metadata")?)?;
        let head_signature = Signature(r.array("head signature")?);
        let head_cert =
            if v == 2 { Some(WriterCert::decode(r.take(WRITER_CERT_LEN, "head certificate")?)?) } else { None };
        let n = r.u32("step count")?;
        if n > PROOF_STEPS_MAX {
            return Err(DecodeError::Limit { field: "step count", len: n as u64, max: PROOF_STEPS_MAX as u64 }.into());
        }
        let header_max =
            (HEADER_FIXED_LEN + LINK_LEN * metadata.meta.policy.limits.links_per_record_max as usize) as u64;
        let mut steps = Vec::new();
        for _ in 0..n {
            let hl = r.u32("step header length")? as u64;
            let header = r.bounded(hl, header_max, "step header")?.to_vec();
            let body_len = r.u32("step body length")?;
            let body_digest = Hash256(r.array("step body digest")?);
            steps.push(ProofStep { header, body_len, body_digest });
        }
        r.finish("proof")?;
        Ok(MembershipProof { metadata, head_signature, head_cert, steps })
    }
}

/// Writer `writer`'s generation-0 certificate, from the Cert records of `replica`.
fn cert_in(metadata: &SignedMetadata, replica: &Replica, writer: u32) -> Option<WriterCert> {
    let limits = &metadata.meta.policy.limits;
    replica.iter().filter(|r| r.header().kind == Kind::Cert).find_map(|r| {
        let Ok(Body::Certs(list)) = Body::decode(Kind::Cert, r.body(), limits) else { return None };
        list.into_iter().find_map(|s| match s {
            KeyStatement::Cert(c) if c.writer == writer && c.key_gen == 0 => Some(c),
            _ => None,
        })
    })
}

/// The checks of one step on its own header: the verifier's writer, key generation, seq/prev
/// and SYNC-writer rules, and no capsule server's key (servers write no records).
fn check_step_alone(policy: &Policy, step: usize, h: &Header) -> Result<(), ProofError> {
    if h.writer >= 1 << 31 || h.key_gen != 0 || (h.seq == 0) != h.prev.is_zero() {
        return Err(ProofError::StepStructure(step));
    }
    if crate::server_id(h.writer).is_some() {
        return Err(ProofError::ServerWriter { step, writer: h.writer });
    }
    if h.kind == Kind::Sync && !policy.is_coordinator(h.writer) {
        return Err(ProofError::SyncWriter { step, writer: h.writer });
    }
    Ok(())
}

/// Whether a record with header `head` may head a proof of a record of `target_writer`: a SYNC
/// (whose writer [`check_step_alone`] has checked) for any writer, any other record for its own.
fn check_head_vouches(head: &Header, target_writer: u32) -> Result<(), ProofError> {
    if head.kind != Kind::Sync && head.writer != target_writer {
        return Err(ProofError::HeadCannotVouch { head_writer: head.writer, head_kind: head.kind, target_writer });
    }
    Ok(())
}

/// How a record (`holder`) points at another (`next`, whose hash is `next_hash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pointer {
    /// By `prev`, or by a link the verifier lets a record of the holder's kind carry.
    Allowed,
    /// Only by a link the verifier would refuse in the holder: the rule it breaks.
    Refused(&'static str),
    /// Not at all.
    None,
}

/// The pointer from `holder` to `next`, judged by the verifier's rules for the holder's kind
/// and writer (`Verifier::check_public`) and the replica's `link-epoch` rule. Both headers have
/// passed [`check_step_alone`] (so a SYNC holder is a coordinator's, and `next` is no server's).
fn pointer(policy: &Policy, holder: &Header, next: &Header, next_hash: &Hash256) -> Pointer {
    if holder.prev == *next_hash && next.writer == holder.writer && next.seq.checked_add(1) == Some(holder.seq) {
        return Pointer::Allowed;
    }
    if !holder.links.iter().any(|l| l.hash == *next_hash && l.writer == next.writer && l.seq == next.seq) {
        return Pointer::None;
    }
    match holder.kind {
        Kind::Data if !policy.is_coordinator(next.writer) => {
            Pointer::Refused("a data record may link only to coordinators' records (its epoch's SYNC)")
        }
        Kind::Data if next.kind != Kind::Sync || next.epoch != holder.epoch => {
            Pointer::Refused("a data record's link must name the SYNC of the record's own epoch")
        }
        // A SYNC links to each writer's last record of the epoch; an EOE (control) names other
        // writers' heads; CapsuleDB and Cert records' links are not restricted by the verifier.
        Kind::Data | Kind::Sync | Kind::Control | Kind::DbBlock | Kind::DbIndex | Kind::Cert => Pointer::Allowed,
    }
}

/// Breadth-first search from `head` along the pointers [`pointer`] allows, to `target`.
fn shortest_path(policy: &Policy, replica: &Replica, head: Hash256, target: Hash256) -> Option<Vec<Hash256>> {
    let mut parent: HashMap<Hash256, Hash256> = HashMap::new();
    let mut queue = VecDeque::from([head]);
    parent.insert(head, head);
    while let Some(h) = queue.pop_front() {
        if h == target {
            let mut path = vec![h];
            let mut cur = h;
            while cur != head {
                cur = parent[&cur];
                path.push(cur);
            }
            path.reverse();
            return Some(path);
        }
        let Some(r) = replica.get(&h) else { continue };
        let hd = r.header();
        let mut next: Vec<Hash256> = hd.links.iter().map(|l| l.hash).collect();
        if !hd.prev.is_zero() {
            next.push(hd.prev);
        }
        for n in next {
            if let Some(nr) = replica.get(&n) {
                // Only follow pointers whose target matches what the pointer names, and that a
                // proof's verifier accepts.
                let nh = nr.header();
                let ok = check_step_alone(policy, 1, nh).is_ok() && pointer(policy, hd, nh, &n) == Pointer::Allowed;
                if ok && !parent.contains_key(&n) {
                    parent.insert(n, h);
                    queue.push_back(n);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{ControlCode, Op};
    use crate::certs::writer_credentials;
    use crate::limits::Limits;
    use crate::record::Record;
    use crate::seal::Draft;
    use crate::verify::Verifier;
    use crate::{new_capsule_with, server_writer, Author, DEFAULT_COORDINATOR};
    use psl_crypto::{AppKey, OwnerKey, SigningKey};

    const APP: u32 = 5;

    fn capsule(keys: WriterKeys) -> (AppKey, SignedMetadata) {
        let owner = OwnerKey::from_seed(&[33; 32]).unwrap();
        let app = owner.app(APP).unwrap();
        let meta = new_capsule_with(&owner, APP, "proofs", 1, Limits::default(), keys).unwrap();
        (app, meta)
    }

    /// Seals whatever header an attacker chooses, signed with `key` (only a head's signature
    /// is ever checked by a proof).
    #[allow(clippy::too_many_arguments)]
    fn forge(
        meta: &SignedMetadata,
        app: &AppKey,
        key: &SigningKey,
        writer: u32,
        seq: u64,
        prev: Hash256,
        epoch: u64,
        links: Vec<Link>,
        body: Body,
    ) -> Record {
        Draft { writer, key_gen: 0, seq, lamport: 1, epoch, prev, links, body }
            .seal(meta.name(), &meta.meta.policy.limits, key, &app.data_key())
            .unwrap()
    }

    fn data() -> Body {
        Body::Data(vec![Op::put(1, b"balance".to_vec(), b"1000000".to_vec())])
    }

    fn eoe() -> Body {
        Body::Control { code: ControlCode::Eoe, payload: vec![0; 8] }
    }

    fn step(r: &Record) -> ProofStep {
        ProofStep { header: r.header_bytes().to_vec(), body_len: r.body_len(), body_digest: r.body_digest() }
    }

    /// A proof from `path[0]` (the head, whose signature it carries) down to the last record,
    /// encoded and decoded again as a verifier would receive it.
    fn proof(meta: &SignedMetadata, head_cert: Option<WriterCert>, path: &[&Record]) -> MembershipProof {
        let p = MembershipProof {
            metadata: meta.clone(),
            head_signature: path[0].signature(),
            head_cert,
            steps: path.iter().map(|r| step(r)).collect(),
        };
        MembershipProof::decode(&p.encode()).unwrap()
    }

    /// The attack of the issue: capsule server 0 holds a certified key (it signs acks with it),
    /// makes up a record of writer 7 and heads a proof of it with a record of its own.
    #[test]
    fn a_server_ack_key_cannot_head_a_proof() {
        let (app, meta) = capsule(WriterKeys::Certified);
        let s = server_writer(0).unwrap();
        let (key, cert) = writer_credentials(&meta, &app, s).unwrap();
        let cert = cert.expect("a certified capsule certifies its servers' ack keys");
        let fake = forge(&meta, &app, &key, 7, 0, Hash256::ZERO, 0, vec![], data());
        // Headed by a control record (whose links the verifier does not restrict) ...
        let head = forge(&meta, &app, &key, s, 0, Hash256::ZERO, 0, vec![fake.link()], eoe());
        let r = proof(&meta, Some(cert.clone()), &[&head, &fake]).verify(Some(meta.name()));
        assert!(matches!(r, Err(ProofError::ServerWriter { step: 0, writer }) if writer == s), "{r:?}");
        // ... or by a data record, ...
        let head = forge(&meta, &app, &key, s, 0, Hash256::ZERO, 0, vec![fake.link()], data());
        let r = proof(&meta, Some(cert.clone()), &[&head, &fake]).verify(Some(meta.name()));
        assert!(matches!(r, Err(ProofError::ServerWriter { step: 0, .. })), "{r:?}");
        // ... or claiming only a record of its own range: servers write no records at all.
        let own0 = forge(&meta, &app, &key, s, 0, Hash256::ZERO, 0, vec![], data());
        let own1 = forge(&meta, &app, &key, s, 1, own0.hash(), 0, vec![], data());
        let r = proof(&meta, Some(cert.clone()), &[&own1, &own0]).verify(Some(meta.name()));
        assert!(matches!(r, Err(ProofError::ServerWriter { step: 0, .. })), "{r:?}");
        let r = proof(&meta, Some(cert), &[&own0]).verify(Some(meta.name()));
        assert!(matches!(r, Err(ProofError::ServerWriter { step: 0, .. })), "{r:?}");
        // The same in a capsule that derives writer keys (a server's key is derivable there).
        let (app, meta) = capsule(WriterKeys::Derived);
        let key = app.writer(s).unwrap();
        let fake = forge(&meta, &app, &key, 7, 0, Hash256::ZERO, 0, vec![], data());
        let head = forge(&meta, &app, &key, s, 0, Hash256::ZERO, 0, vec![fake.link()], eoe());
        let r = proof(&meta, None, &[&head, &fake]).verify(Some(meta.name()));
        assert!(matches!(r, Err(ProofError::ServerWriter { step: 0, .. })), "{r:?}");
    }

    /// A certified worker writer is no better placed than a server to vouch for another
    /// writer's record: only a coordinator's SYNC vouches for other writers.
    #[test]
    fn a_writer_head_vouches_only_for_its_own_records() {
        let (app, meta) = capsule(WriterKeys::Certified);
        let (key, cert) = writer_credentials(&meta, &app, 3).unwrap();
        let fake = forge(&meta, &app, &key, 7, 0, Hash256::ZERO, 0, vec![], data());
        // An EOE may link to other writers' heads: the link itself is one the verifier allows.
        let head = forge(&meta, &app, &key, 3, 0, Hash256::ZERO, 0, vec![fake.link()], eoe());
        let r = proof(&meta, cert.clone(), &[&head, &fake]).verify(Some(meta.name()));
        assert!(
            matches!(
                r,
                Err(ProofError::HeadCannotVouch { head_writer: 3, head_kind: Kind::Control, target_writer: 7 })
            ),
            "{r:?}"
        );
        // A coordinator's records other than its SYNCs vouch only for its own chain too.
        let (ckey, ccert) = writer_credentials(&meta, &app, DEFAULT_COORDINATOR).unwrap();
        let head = forge(&meta, &app, &ckey, DEFAULT_COORDINATOR, 0, Hash256::ZERO, 0, vec![fake.link()], eoe());
        let r = proof(&meta, ccert, &[&head, &fake]).verify(Some(meta.name()));
        assert!(matches!(r, Err(ProofError::HeadCannotVouch { head_kind: Kind::Control, .. })), "{r:?}");
        // Its own records it may prove: a later record reaches an earlier one by `prev`.
        let own1 = forge(&meta, &app, &key, 3, 1, head_of(&meta, &app, &key).hash(), 0, vec![], data());
        let own0 = head_of(&meta, &app, &key);
        let out = proof(&meta, cert, &[&own1, &own0]).verify(Some(meta.name())).unwrap();
        assert_eq!((out.head.writer, out.head_kind, out.target.writer), (3, Kind::Data, 3));
    }

    /// Writer 3's seq 0, made the same way every time (a fixed salt keeps its hash stable).
    fn head_of(meta: &SignedMetadata, app: &AppKey, key: &SigningKey) -> Record {
        Draft { writer: 3, key_gen: 0, seq: 0, lamport: 1, epoch: 0, prev: Hash256::ZERO, links: vec![], body: data() }
            .seal_with_salt([9; psl_crypto::SALT_LEN], meta.name(), &meta.meta.policy.limits, key, &app.data_key())
            .unwrap()
    }

    /// An honest coordinator's SYNC links to the head writer 1 reported; writer 1 made that
    /// record up with links the verifier refuses. A path through them proves nothing.
    #[test]
    fn a_step_follows_only_links_the_verifier_allows() {
        let (app, meta) = capsule(WriterKeys::Derived);
        let w1 = app.writer(1).unwrap();
        let coord = app.writer(DEFAULT_COORDINATOR).unwrap();
        let c = DEFAULT_COORDINATOR;
        let fake7 = forge(&meta, &app, &w1, 7, 0, Hash256::ZERO, 0, vec![], data());
        let sync_of = |links: Vec<Link>, epoch: u64, seq: u64, prev: Hash256| {
            forge(
                &meta,
                &app,
                &coord,
                c,
                seq,
                prev,
                epoch,
                links,
                Body::Sync { app_key_fp: meta.meta.app.fingerprint() },
            )
        };
        let refused = |path: &[&Record], step: usize| {
            let r = proof(&meta, None, path).verify(Some(meta.name()));
            assert!(matches!(&r, Err(ProofError::LinkNotAllowed { step: s, .. }) if *s == step), "{r:?}");
        };
        // (1) A data record linking to another writer's (non-coordinator) record.
        let bad = forge(&meta, &app, &w1, 1, 0, Hash256::ZERO, 0, vec![fake7.link()], data());
        let sync = sync_of(vec![bad.link()], 1, 0, Hash256::ZERO);
        refused(&[&sync, &bad, &fake7], 2);
        // (2) A data record linking to a coordinator's record that is not a SYNC ...
        let coord_eoe = forge(&meta, &app, &coord, c, 0, Hash256::ZERO, 0, vec![fake7.link()], eoe());
        let bad = forge(&meta, &app, &w1, 1, 0, Hash256::ZERO, 0, vec![coord_eoe.link()], data());
        let sync = sync_of(vec![bad.link()], 1, 1, coord_eoe.hash());
        refused(&[&sync, &bad, &coord_eoe, &fake7], 2);
        // (3) ... or to a SYNC of another epoch than its own.
        let old_sync = sync_of(vec![fake7.link()], 1, 0, Hash256::ZERO);
        let bad = forge(&meta, &app, &w1, 1, 0, Hash256::ZERO, 2, vec![old_sync.link()], data());
        let sync = sync_of(vec![bad.link()], 3, 1, old_sync.hash());
        refused(&[&sync, &bad, &old_sync, &fake7], 2);
        // (4) A SYNC in the middle of the path by a writer that is no coordinator.
        let fake_sync = forge(
            &meta,
            &app,
            &w1,
            1,
            0,
            Hash256::ZERO,
            1,
            vec![fake7.link()],
            Body::Sync { app_key_fp: meta.meta.app.fingerprint() },
        );
        let sync = sync_of(vec![fake_sync.link()], 2, 0, Hash256::ZERO);
        let r = proof(&meta, None, &[&sync, &fake_sync, &fake7]).verify(Some(meta.name()));
        assert!(matches!(r, Err(ProofError::SyncWriter { step: 1, writer: 1 })), "{r:?}");
        // (5) A step by a server's key, even one an honest SYNC links to.
        let s = server_writer(3).unwrap();
        let srv = forge(&meta, &app, &app.writer(s).unwrap(), s, 0, Hash256::ZERO, 0, vec![], eoe());
        let sync = sync_of(vec![srv.link()], 1, 0, Hash256::ZERO);
        let r = proof(&meta, None, &[&sync, &srv]).verify(Some(meta.name()));
        assert!(matches!(r, Err(ProofError::ServerWriter { step: 1, .. })), "{r:?}");
        // The honest shape passes: SYNC -> writer 1's last record; writer 1's next record -> SYNC.
        let good = forge(&meta, &app, &w1, 1, 0, Hash256::ZERO, 0, vec![], data());
        let sync = sync_of(vec![good.link()], 1, 0, Hash256::ZERO);
        let out = proof(&meta, None, &[&sync, &good]).verify(Some(meta.name())).unwrap();
        assert_eq!((out.head.writer, out.head_kind, out.target.writer), (c, Kind::Sync, 1));
        let next = forge(&meta, &app, &w1, 1, 1, good.hash(), 1, vec![sync.link()], data());
        let out = proof(&meta, None, &[&next, &sync, &good]).verify(Some(meta.name())).unwrap();
        assert_eq!((out.head.writer, out.head_kind, out.target.seq), (1, Kind::Data, 0));
    }

    /// Honest proofs in a certified capsule: every record, from the newest SYNC or its
    /// writer's head, and an explicit head that cannot vouch is refused when building.
    #[test]
    fn honest_certified_proofs_verify_and_build_refuses_a_head_that_cannot_vouch() {
        let (app, meta) = capsule(WriterKeys::Certified);
        let v = Verifier::new(meta.clone(), None);
        let mut rep = Replica::new(meta.name());
        let mut add = |r: Record| rep_insert(&v, &mut rep, r);
        let mut writers: Vec<Author> = (1..=2).map(|w| Author::new(&meta, &app, w).unwrap()).collect();
        let mut coord = Author::new(&meta, &app, DEFAULT_COORDINATOR).unwrap();
        add(coord.write_own_cert().unwrap().unwrap());
        let mut heads = Vec::new();
        for a in writers.iter_mut() {
            add(a.write_own_cert().unwrap().unwrap());
            let r = a.write_ops([("k", Some("v"))]).unwrap();
            heads.push(r.link());
            add(r);
        }
        let sync = coord.write_sync(heads).unwrap();
        add(sync.clone());
        for a in writers.iter_mut() {
            a.enter_epoch(sync.link(), 1);
            add(a.write_ops([("after", None::<Vec<u8>>)]).unwrap());
        }
        for rec in rep.iter() {
            let p = MembershipProof::build(&meta, &rep, rec.hash(), None).unwrap();
            let out = MembershipProof::decode(&p.encode()).unwrap().verify(Some(meta.name())).unwrap();
            assert_eq!(out.target.hash, rec.hash());
            assert!(out.head_kind == Kind::Sync || out.head.writer == out.target.writer, "{out:?}");
        }
        // Writer 2's newest record cannot vouch for writer 1's first.
        let w2_head = rep.heads()[&2].hash;
        let w1_first = rep.at(1, 1).next().unwrap().hash();
        let r = MembershipProof::build(&meta, &rep, w1_first, Some(w2_head));
        assert!(matches!(r, Err(ProofError::HeadCannotVouch { head_writer: 2, target_writer: 1, .. })), "{r:?}");
    }

    /// A step whose `prev` names a record at seq `u64::MAX`: refused, without an overflow.
    #[test]
    fn a_prev_to_the_last_seq_is_refused_without_overflow() {
        let (app, meta) = capsule(WriterKeys::Derived);
        let key = app.writer(4).unwrap();
        let last = forge(&meta, &app, &key, 4, u64::MAX, Hash256([1; 32]), 0, vec![], data());
        let head = forge(&meta, &app, &key, 4, 5, last.hash(), 0, vec![], data());
        let r = proof(&meta, None, &[&head, &last]).verify(Some(meta.name()));
        assert!(matches!(r, Err(ProofError::Unlinked { step: 1, .. })), "{r:?}");
    }

    fn rep_insert(v: &Verifier, rep: &mut Replica, r: Record) {
        rep.insert(v.verify(r).unwrap()).unwrap();
    }
}
