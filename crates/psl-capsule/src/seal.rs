//! The writer's side: turning a header and a plaintext body into a sealed, hashed, signed record.

use crate::body::Body;
use crate::limits::Limits;
use crate::meta::CapsuleName;
use crate::record::{Header, Link, Record, HEADER_FIXED_LEN, LINK_LEN};
use psl_crypto::{DataKey, Hash256, SigningKey, SALT_LEN, SIGNATURE_LEN, TAG_LEN};

/// Everything a writer decides about a record before it is sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    pub writer: u32,
    pub key_gen: u32,
    pub seq: u64,
    pub lamport: u64,
    pub epoch: u64,
    pub prev: Hash256,
    pub links: Vec<Link>,
    pub body: Body,
}

/// Why a draft cannot be sealed. These are caller bugs or over-limit inputs; nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("body does not fit the capsule's limits: {0}")]
    Body(#[from] crate::codec::DecodeError),
    #[error("{links} links, over the limit of {max}")]
    Links { links: usize, max: u32 },
    #[error("record would be {len} bytes, over the limit of {max}")]
    RecordSize { len: usize, max: u32 },
    #[error("seq {seq} with {} prev pointer: seq 0 has none, every later seq has one", if *has_prev { "a" } else { "no" })]
    Prev { seq: u64, has_prev: bool },
    #[error("the limits given are outside the hard ceilings (Limits::CEILING)")]
    Limits,
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
        let rec = Record::assemble(header, &body, |h| key.sign(h));
        debug_assert_eq!(rec.bytes().len(), len);
        Ok(rec)
    }
}
