//! Membership proofs: evidence, checkable with public keys alone, that a record belongs to a
//! capsule's history as fixed by a signed head (a later record of the writer, or a SYNC).
//!
//! A proof carries the owner-signed metadata (the trust anchor, named by the capsule name), the
//! head's signature, and a path of steps from the head down to the target. Each step is a record
//! header plus its body length and body digest: enough to recompute the record hash without the
//! body. Step `i + 1`'s hash must appear among step `i`'s pointers (`prev` or a link).

use crate::body::Body;
use crate::certs::{CertError, KeyStatement, WriterCert, WriterKeys, WRITER_CERT_LEN};
use crate::codec::{DecodeError, Put, Reader};
use crate::meta::{CapsuleName, MetadataError, SignedMetadata};
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProofStep {
    pub header: Vec<u8>,
    pub body_len: u32,
    pub body_digest: Hash256,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipProof {
    pub metadata: SignedMetadata,
    pub head_signature: Signature,
    /// The head writer's certificate, in a capsule that certifies writers (its public key is not
    /// derivable). A proof shows the head was signed by a certified writer; whether that writer
    /// was revoked before the head's epoch is a question for the log, which carries revocations.
    pub head_cert: Option<WriterCert>,
    /// `steps[0]` is the signed head, the last step is the target.
    pub steps: Vec<ProofStep>,
}

/// What a valid proof establishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProofOutcome {
    pub capsule: CapsuleName,
    pub head: Link,
    pub head_kind: Kind,
    pub target: Link,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("proof encoding: {0}")]
    Decode(#[from] DecodeError),
    #[error("proof metadata: {0}")]
    Metadata(#[from] MetadataError),
    #[error("proof is for capsule {found}, expected {expected}")]
    Capsule { expected: CapsuleName, found: CapsuleName },
    #[error("proof has no steps")]
    Empty,
    #[error("step {0} belongs to another capsule")]
    StepCapsule(usize),
    #[error("step {0} breaks a structural rule (unknown key generation, or prev inconsistent with seq)")]
    StepStructure(usize),
    #[error("head signature does not verify under writer {0}'s key")]
    HeadSignature(u32),
    #[error("step {step} ({hash}) is not pointed at by step {}", step - 1)]
    Unlinked { step: usize, hash: Hash256 },
    #[error("target {0} is not in the replica")]
    UnknownTarget(Hash256),
    #[error("head {0} is not in the replica")]
    UnknownHead(Hash256),
    #[error("no chain of pointers leads from head {head} to target {target}")]
    NoPath { head: Hash256, target: Hash256 },
    #[error("head writer {0} has no certificate in the replica (a certified capsule's proof carries one)")]
    NoHeadCert(u32),
    #[error("head certificate: {0}")]
    HeadCert(#[from] CertError),
}

impl MembershipProof {
    /// Builds a proof that `target` is in `replica`. With no `head`, picks the newest SYNC that
    /// reaches the target, else the newest record of the target's writer.
    pub fn build(
        metadata: &SignedMetadata,
        replica: &Replica,
        target: Hash256,
        head: Option<Hash256>,
    ) -> Result<MembershipProof, ProofError> {
        let t = replica.get(&target).ok_or(ProofError::UnknownTarget(target))?;
        let candidates: Vec<Hash256> = match head {
            Some(h) => {
                replica.get(&h).ok_or(ProofError::UnknownHead(h))?;
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
            if let Some(path) = shortest_path(replica, *head, target) {
                let head_rec = replica.get(head).expect("candidate heads are in the replica");
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
    pub fn verify(&self, expected: Option<CapsuleName>) -> Result<ProofOutcome, ProofError> {
        let capsule = self.metadata.name();
        if let Some(e) = expected {
            if e != capsule {
                return Err(ProofError::Capsule { expected: e, found: capsule });
            }
        }
        let limits = &self.metadata.meta.policy.limits;
        let mut prev: Option<(Header, Hash256)> = None;
        let mut head = None;
        for (i, s) in self.steps.iter().enumerate() {
            let h = Header::decode(&s.header, limits)?;
            if h.capsule != capsule {
                return Err(ProofError::StepCapsule(i));
            }
            if h.key_gen != 0 || (h.seq == 0) != h.prev.is_zero() {
                return Err(ProofError::StepStructure(i));
            }
            let hash = record_hash(&s.header, s.body_len, &s.body_digest);
            match &prev {
                None => {
                    let key = match (&self.head_cert, self.metadata.meta.policy.writer_keys) {
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
                    if h.kind == Kind::Sync && !self.metadata.meta.policy.is_coordinator(h.writer) {
                        return Err(ProofError::HeadSignature(h.writer));
                    }
                    head = Some((Link { writer: h.writer, seq: h.seq, hash }, h.kind));
                }
                Some((ph, _)) => {
                    let by_prev = ph.prev == hash && h.writer == ph.writer && h.seq + 1 == ph.seq;
                    let by_link = ph.links.iter().any(|l| l.hash == hash && l.writer == h.writer && l.seq == h.seq);
                    if !(by_prev || by_link) {
                        return Err(ProofError::Unlinked { step: i, hash });
                    }
                }
            }
            prev = Some((h, hash));
        }
        let (th, thash) = prev.ok_or(ProofError::Empty)?;
        let (head, head_kind) = head.ok_or(ProofError::Empty)?;
        Ok(ProofOutcome { capsule, head, head_kind, target: Link { writer: th.writer, seq: th.seq, hash: thash } })
    }

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

/// Breadth-first search from `head` along `prev` and link pointers to `target`.
fn shortest_path(replica: &Replica, head: Hash256, target: Hash256) -> Option<Vec<Hash256>> {
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
                // Only follow pointers whose target matches what the pointer names.
                let ok = if n == hd.prev {
                    nr.header().writer == hd.writer && nr.header().seq + 1 == hd.seq
                } else {
                    hd.links.iter().any(|l| l.hash == n && l.writer == nr.header().writer && l.seq == nr.header().seq)
                };
                if ok && !parent.contains_key(&n) {
                    parent.insert(n, h);
                    queue.push_back(n);
                }
            }
        }
    }
    None
}
