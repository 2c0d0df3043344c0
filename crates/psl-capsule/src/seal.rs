//! The writer's side: turning a header and a plaintext body into a sealed, hashed, signed record.

use crate::body::Body;
use crate::limits::Limits;
use crate::meta::CapsuleName;
use crate::record::{Header, Link, Record, Unsigned, HEADER_FIXED_LEN, LINK_LEN};
use psl_crypto::{DataKey, Hash256, SigningKey, SALT_LEN, SIGNATURE_LEN, TAG_LEN};

/// Everything a writer decides about a record before it is sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    /// Writer index (below 2^31) whose key signs the record.
    pub writer: u32,
    /// Application key generation whose writer key signs and whose data key seals.
    pub key_gen: u32,
    /// Position in the writer's chain; 0 exactly when `prev` is zero.
    pub seq: u64,
    /// Lamport time; for a data body, must equal the last op's.
    pub lamport: u64,
    /// Number of the newest SYNC the writer has seen.
    pub epoch: u64,
    /// Hash of the writer's record `seq - 1`; zero for seq 0.
    pub prev: Hash256,
    /// Hash pointers besides `prev`, at most the capsule's `links_per_record_max`.
    pub links: Vec<Link>,
    /// The plaintext body; its kind becomes the record's kind.
    pub body: Body,
}

/// Why a draft cannot be sealed. These are caller bugs or over-limit inputs; nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The body fails `Body::check` under the capsule's limits and the draft's Lamport time.
    #[error("body does not fit the capsule's limits: {0}")]
    Body(#[from] crate::codec::DecodeError),
    /// More links than `links_per_record_max`.
    #[error("{links} links, over the limit of {max}")]
    Links {
        /// Links in the draft.
        links: usize,
        /// The capsule's `links_per_record_max`.
        max: u32,
    },
    /// The sealed record, signature included, would exceed `record_bytes_max`.
    #[error("record would be {len} bytes, over the limit of {max}")]
    RecordSize {
        /// Bytes the sealed record would take.
        len: usize,
        /// The capsule's `record_bytes_max`, in bytes.
        max: u32,
    },
    /// The chain rule is broken: seq 0 must have a zero `prev`, every later seq a non-zero one.
    #[error("seq {seq} with {} prev pointer: seq 0 has none, every later seq has one", if *has_prev { "a" } else { "no" })]
    Prev {
        /// The draft's seq.
        seq: u64,
        /// Whether the draft's `prev` is non-zero.
        has_prev: bool,
    },
    /// The limits passed are above [`Limits::CEILING`] (or a minimum is 0).
    #[error("the limits given are outside the hard ceilings (Limits::CEILING)")]
    Limits,
    /// The writer index is 2^31 or more.
    #[error("writer index {0} is not a non-hardened child index")]
    Writer(u32),
}

impl Draft {
    /// Seals, hashes and signs, with a fresh random salt. Checks every limit before producing
    /// any bytes.
    pub fn seal(
        self,
        capsule: CapsuleName,
        limits: &Limits,
        key: &SigningKey,
        data_key: &DataKey,
    ) -> Result<Record, SealError> {
        let mut salt = [0u8; SALT_LEN];
        rand::fill(&mut salt);
        self.seal_with_salt(salt, capsule, limits, key, data_key)
    }

    /// Like [`Draft::seal`] with a given salt. The salt must never repeat under one data key
    /// for the same (capsule, writer, seq); a seeded simulation uses this to replay exactly.
    pub fn seal_with_salt(
        self,
        salt: [u8; SALT_LEN],
        capsule: CapsuleName,
        limits: &Limits,
        key: &SigningKey,
        data_key: &DataKey,
    ) -> Result<Record, SealError> {
        let unsigned = self.seal_unsigned(salt, capsule, limits, data_key)?;
        let sig = key.sign(&unsigned.hash());
        Ok(unsigned.finish(sig))
    }

    /// [`Draft::seal_with_salt`] but for the signature: every check, the sealed body and the
    /// record hash, which the next record's `prev` needs and the signature does not change.
    pub(crate) fn seal_unsigned(
        self,
        salt: [u8; SALT_LEN],
        capsule: CapsuleName,
        limits: &Limits,
        data_key: &DataKey,
    ) -> Result<Unsigned, SealError> {
        if !limits.within_ceiling() {
            return Err(SealError::Limits);
        }
        if self.writer >= 1 << 31 {
            return Err(SealError::Writer(self.writer));
        }
        if (self.seq == 0) != self.prev.is_zero() {
            return Err(SealError::Prev { seq: self.seq, has_prev: !self.prev.is_zero() });
        }
        if self.links.len() > limits.links_per_record_max as usize {
            return Err(SealError::Links { links: self.links.len(), max: limits.links_per_record_max });
        }
        self.body.check(limits, self.lamport)?;
        // Encrypted in place below: the only plaintext copy, erased here if sealing stops first.
        let mut body = self.body.encode();
        let public = self.body.kind().is_public();
        let tag_len = if public { 0 } else { TAG_LEN };
        let len = HEADER_FIXED_LEN + LINK_LEN * self.links.len() + 4 + body.len() + tag_len + SIGNATURE_LEN;
        if len > limits.record_bytes_max as usize {
            zeroize::Zeroize::zeroize(&mut body);
            return Err(SealError::RecordSize { len, max: limits.record_bytes_max });
        }
        let header = Header {
            kind: self.body.kind(),
            capsule,
            writer: self.writer,
            key_gen: self.key_gen,
            seq: self.seq,
            lamport: self.lamport,
            epoch: self.epoch,
            salt,
            prev: self.prev,
            links: self.links,
        };
        let mut aad = Vec::with_capacity(header.encoded_len());
        header.encode_into(&mut aad);
        let ctx = Record::seal_context(&capsule, header.writer, header.seq);
        if !public {
            data_key.seal_in_place(&salt, &ctx, &aad, &mut body);
        }
        let unsigned = Record::assemble_unsigned(header, &body);
        debug_assert_eq!(unsigned.signed_len(), len);
        Ok(unsigned)
    }
}
