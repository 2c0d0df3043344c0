//! Capsule metadata and names.
//!
//! The name of a capsule is SHA-256 over its canonical metadata encoding, and the owner signs
//! that name with the owner master key, so that nobody can mint a capsule in someone else's name.

use crate::codec::{DecodeError, Put, Reader};
use crate::limits::Limits;
use psl_crypto::{sha256, AppPublicKey, Hash256, OwnerPublicKey, Signature, SigningKey, VerifyingKey};
use std::fmt;

const META_MAGIC: &[u8; 4] = b"PSLM";
/// Version 1: writer keys derived from the application public key. Version 2 adds one byte,
/// the [`WriterKeys`] scheme, after the data key fingerprint. A capsule whose writers are derived
/// is still written as version 1, so its name (the hash of this encoding) never changes.
pub const META_VERSION: u8 = 2;
/// Most bytes a label may have.
pub const LABEL_BYTES_MAX: usize = 255;
/// Largest encoded metadata (with the largest label).
pub const META_BYTES_MAX: usize = 4 + 1 + 33 + 4 + 65 + 8 + 1 + LABEL_BYTES_MAX + 4 + 1 + 5 * 4 + 32 + 1;

/// The 256-bit name of a DataCapsule, printed as lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CapsuleName(pub Hash256);

impl fmt::Display for CapsuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for CapsuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CapsuleName({})", self.0.short())
    }
}

/// Rules every writer and reader of a capsule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Writer index of the primary coordinator. Coordinators (primary and shadows) are the
    /// writers `coordinator, coordinator - 1, ..., coordinator - (coordinators - 1)`: the only
    /// writers allowed to write SYNC records.
    pub coordinator: u32,
    /// How many coordinator writer indices there are (1 to `coordinator + 1`, at most 255).
    pub coordinators: u8,
    /// Size limits every replica enforces, each within [`Limits::CEILING`].
    pub limits: Limits,
    /// Fingerprint of the application data key, so a key holder can tell it has the right one.
    pub data_key_fp: Hash256,
    /// How verifiers learn writer keys: derived (version-1 capsules) or certified.
    pub writer_keys: WriterKeys,
}

impl Policy {
    /// Whether writer `w` is one of the coordinators (and so may write SYNC records).
    pub fn is_coordinator(&self, w: u32) -> bool {
        w <= self.coordinator && self.coordinator - w < self.coordinators as u32
    }

    /// Rank of coordinator `w`: 0 for the primary, 1.. for the shadows.
    pub fn coordinator_rank(&self, w: u32) -> Option<u8> {
        self.is_coordinator(w).then(|| (self.coordinator - w) as u8)
    }

    /// Writer index of the coordinator of rank `r`.
    pub fn coordinator_at(&self, r: u8) -> Option<u32> {
        (r < self.coordinators).then(|| self.coordinator - r as u32)
    }
}

/// Canonical capsule metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The owner master public key, which signs the capsule name and rotation certificates.
    pub owner: OwnerPublicKey,
    /// Hardened child index of the application key under the owner master key (below 2^31).
    pub app_index: u32,
    /// Extended public key (point and chain code) of generation 0's application key `m/a'`.
    pub app: AppPublicKey,
    /// Creation time, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// Free-form UTF-8 label, at most [`LABEL_BYTES_MAX`] bytes.
    pub label: String,
    /// Coordinators, limits, data key fingerprint and writer key scheme.
    pub policy: Policy,
}

impl Metadata {
    /// The canonical encoding (version 1 for derived writer keys, 2 for certified), whose
    /// SHA-256 is the capsule name. Panics on a label over [`LABEL_BYTES_MAX`].
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.label.len() <= LABEL_BYTES_MAX, "label checked by the constructor");
        let mut b = Vec::with_capacity(META_BYTES_MAX);
        b.extend_from_slice(META_MAGIC);
        let certified = self.policy.writer_keys == WriterKeys::Certified;
        b.put_u8(if certified { 2 } else { 1 });
        b.extend_from_slice(&self.owner.0.to_bytes());
        b.put_u32(self.app_index);
        b.extend_from_slice(&self.app.to_bytes());
        b.put_u64(self.created_ms);
        b.put_u8(self.label.len() as u8);
        b.extend_from_slice(self.label.as_bytes());
        b.put_u32(self.policy.coordinator);
        b.put_u8(self.policy.coordinators);
        let l = &self.policy.limits;
        for v in [l.key_bytes_max, l.value_bytes_max, l.ops_per_record_max, l.links_per_record_max, l.record_bytes_max]
        {
            b.put_u32(v);
        }
        b.extend_from_slice(&self.policy.data_key_fp.0);
        if certified {
            b.put_u8(self.policy.writer_keys as u8);
        }
        assert!(b.len() <= META_BYTES_MAX, "metadata within META_BYTES_MAX (Metadata::decode refuses more)");
        // The capsule's name is the hash of these bytes: they must read back as this metadata
        // (a full decode, with two curve points: debug builds only).
        debug_assert!(Metadata::decode(&b).as_ref() == Ok(self), "encoded metadata must decode to itself");
        b
    }

    /// Decodes exactly `bytes` (at most [`META_BYTES_MAX`]), refusing an unknown version, keys
    /// that are not curve points, indices at or above 2^31 and limits above the ceilings.
    pub fn decode(bytes: &[u8]) -> Result<Metadata, DecodeError> {
        if bytes.len() > META_BYTES_MAX {
            return Err(DecodeError::Limit { field: "metadata", len: bytes.len() as u64, max: META_BYTES_MAX as u64 });
        }
        let mut r = Reader::new(bytes);
        if &r.array::<4>("metadata magic")? != META_MAGIC {
            return Err(DecodeError::Magic { what: "metadata" });
        }
        let v = r.u8("metadata version")?;
        if v != 1 && v != META_VERSION {
            return Err(DecodeError::Version { what: "metadata", found: v, supported: META_VERSION });
        }
        let owner = VerifyingKey::from_bytes(r.take(33, "owner public key")?)
            .map_err(|_| DecodeError::Invalid { field: "owner public key", why: "not a secp256k1 point" })?;
        let app_index = r.u32("application index")?;
        if app_index >= 1 << 31 {
            return Err(DecodeError::Invalid { field: "application index", why: "must be below 2^31" });
        }
        let app = AppPublicKey::from_bytes(r.take(65, "application public key")?)
            .map_err(|_| DecodeError::Invalid { field: "application public key", why: "not a secp256k1 point" })?;
        let created_ms = r.u64("creation time")?;
        let label_len = r.u8("label length")? as u64;
        let label = r.bounded(label_len, LABEL_BYTES_MAX as u64, "label")?;
        let label = std::str::from_utf8(label).map_err(|_| DecodeError::Utf8 { field: "label" })?.to_string();
        let coordinator = r.u32("coordinator writer")?;
        if coordinator >= 1 << 31 {
            return Err(DecodeError::Invalid { field: "coordinator writer", why: "must be below 2^31" });
        }
        let coordinators = r.u8("coordinator count")?;
        if coordinators == 0 || coordinators as u32 > coordinator + 1 {
            return Err(DecodeError::Invalid { field: "coordinator count", why: "must be 1 to coordinator + 1" });
        }
        let limits = Limits {
            key_bytes_max: r.u32("key_bytes_max")?,
            value_bytes_max: r.u32("value_bytes_max")?,
            ops_per_record_max: r.u32("ops_per_record_max")?,
            links_per_record_max: r.u32("links_per_record_max")?,
            record_bytes_max: r.u32("record_bytes_max")?,
        };
        if !limits.within_ceiling() {
            return Err(DecodeError::Invalid { field: "policy limits", why: "outside the hard ceilings" });
        }
        let data_key_fp = Hash256(r.array("data key fingerprint")?);
        let writer_keys = if v == 1 {
            WriterKeys::Derived
        } else {
            // Version 2 exists to name a scheme other than version 1's: one canonical encoding.
            match WriterKeys::from_u8(r.u8("writer key scheme")?) {
                Some(WriterKeys::Certified) => WriterKeys::Certified,
                _ => {
                    return Err(DecodeError::Invalid {
                        field: "writer key scheme",
                        why: "version 2 names certified writers",
                    })
                }
            }
        };
        r.finish("metadata")?;
        Ok(Metadata {
            owner: OwnerPublicKey(owner),
            app_index,
            app,
            created_ms,
            label,
            policy: Policy { coordinator, coordinators, limits, data_key_fp, writer_keys },
        })
    }

    /// The capsule name: SHA-256 over the canonical encoding.
    pub fn name(&self) -> CapsuleName {
        CapsuleName(sha256(&[&self.encode()]))
    }
}

/// Metadata with the owner's signature over the capsule name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedMetadata {
    /// The metadata; its encoding hashes to the capsule name.
    pub meta: Metadata,
    /// The owner master key's signature over the 32-byte capsule name (so over every metadata byte).
    pub signature: Signature,
    name: CapsuleName,
}

/// Why metadata cannot be signed or why signed metadata is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// The metadata or its signed envelope does not decode.
    #[error("metadata encoding: {0}")]
    Decode(#[from] DecodeError),
    /// The owner signature does not verify under the owner key the metadata names (when
    /// signing: the key given is not that owner's).
    #[error("metadata signature does not verify under the owner key it names")]
    Signature,
    /// The label is longer than [`LABEL_BYTES_MAX`]; carries its length in bytes.
    #[error("label is {0} bytes, over the limit of {LABEL_BYTES_MAX}")]
    Label(usize),
    /// The policy limits are above [`Limits::CEILING`] (or a minimum is 0).
    #[error("policy limits are outside the hard ceilings")]
    Limits,
    /// The application index or coordinator writer is at or above 2^31, or the coordinator
    /// count is not 1 to `coordinator + 1`.
    #[error("application index and coordinator writer must be below 2^31, with 1 to coordinator + 1 coordinators")]
    Index,
}

impl SignedMetadata {
    /// Signs `meta` with the owner master key (which must match `meta.owner`).
    pub fn sign(meta: Metadata, owner_key: &SigningKey) -> Result<SignedMetadata, MetadataError> {
        if meta.label.len() > LABEL_BYTES_MAX {
            return Err(MetadataError::Label(meta.label.len()));
        }
        if !meta.policy.limits.within_ceiling() {
            return Err(MetadataError::Limits);
        }
        let p = &meta.policy;
        if meta.app_index >= 1 << 31
            || p.coordinator >= 1 << 31
            || p.coordinators == 0
            || p.coordinators as u32 > p.coordinator + 1
        {
            return Err(MetadataError::Index);
        }
        let name = meta.name();
        let signature = owner_key.sign(&name.0);
        let s = SignedMetadata { meta, signature, name };
        s.check()?;
        Ok(s)
    }

    /// The capsule name: SHA-256 of the metadata encoding, which the signature covers.
    pub fn name(&self) -> CapsuleName {
        self.name
    }

    fn check(&self) -> Result<(), MetadataError> {
        self.meta.owner.0.verify(&self.name.0, &self.signature).map_err(|_| MetadataError::Signature)
    }

    /// `u16 length || metadata || 64-byte signature`.
    pub fn encode(&self) -> Vec<u8> {
        let m = self.meta.encode();
        let mut b = Vec::with_capacity(2 + m.len() + 64);
        b.put_u16(m.len() as u16);
        b.extend_from_slice(&m);
        b.extend_from_slice(&self.signature.0);
        assert_eq!(SignedMetadata::encoded_len(&b), Ok(b.len()), "signed metadata length prefix");
        b
    }

    /// Decodes and checks the owner signature.
    pub fn decode(bytes: &[u8]) -> Result<SignedMetadata, MetadataError> {
        let mut r = Reader::new(bytes);
        let n = r.u16("metadata length")? as u64;
        let m = r.bounded(n, META_BYTES_MAX as u64, "metadata")?;
        let meta = Metadata::decode(m)?;
        let signature = Signature(r.array("metadata signature")?);
        r.finish("signed metadata")?;
        let s = SignedMetadata { name: CapsuleName(sha256(&[m])), meta, signature };
        s.check()?;
        Ok(s)
    }

    /// Length of the encoding that starts `bytes`, read from its length prefix.
    pub fn encoded_len(bytes: &[u8]) -> Result<usize, DecodeError> {
        let mut r = Reader::new(bytes);
        let n = r.u16("metadata length")? as usize;
        if n > META_BYTES_MAX {
            return Err(DecodeError::Limit { field: "metadata", len: n as u64, max: META_BYTES_MAX as u64 });
        }
        Ok(2 + n + 64)
    }
}

/// How a capsule's verifiers learn writer public keys. Named in the metadata (version 2 and
/// later; version-1 metadata is [`WriterKeys::Derived`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WriterKeys {
    /// Non-hardened BIP32 children `m/a'/w`, derived by anyone from the application public key.
    /// The format of capsules made before certificates; one leaked writer key exposes all.
    Derived = 1,
    /// Hardened children `m/a'/w'`, each known only through a `WriterCert` (`certs`).
    Certified = 2,
}

impl WriterKeys {
    /// The scheme of a metadata scheme byte (1 derived, 2 certified); `None` for any other.
    pub fn from_u8(v: u8) -> Option<WriterKeys> {
        match v {
            1 => Some(WriterKeys::Derived),
            2 => Some(WriterKeys::Certified),
            _ => None,
        }
    }

    /// The scheme's name as printed: `derived` or `certified`.
    pub fn name(self) -> &'static str {
        match self {
            WriterKeys::Derived => "derived",
            WriterKeys::Certified => "certified",
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use psl_crypto::OwnerKey;

    pub(crate) fn sample(owner: &OwnerKey, label: &str) -> SignedMetadata {
        let app = owner.app(7).unwrap();
        let meta = Metadata {
            owner: owner.public(),
            app_index: 7,
            app: app.public(),
            created_ms: 1_700_000_000_000,
            label: label.into(),
            policy: Policy {
                coordinator: 1000,
                coordinators: 2,
                limits: Limits::default(),
                data_key_fp: app.data_key().fingerprint(),
                writer_keys: WriterKeys::Derived,
            },
        };
        SignedMetadata::sign(meta, &owner.signing_key()).unwrap()
    }

    #[test]
    fn certified_metadata_is_version_2_and_derived_stays_version_1() {
        let owner = OwnerKey::from_seed(&[3; 32]).unwrap();
        let v1 = sample(&owner, "demo");
        assert_eq!(v1.meta.encode()[4], 1, "a derived capsule keeps the version-1 encoding (and its name)");
        let mut m = v1.meta.clone();
        m.policy.writer_keys = WriterKeys::Certified;
        let v2 = SignedMetadata::sign(m, &owner.signing_key()).unwrap();
        let enc = v2.meta.encode();
        assert_eq!(enc[4], 2);
        assert_eq!(enc.len(), v1.meta.encode().len() + 1);
        assert_ne!(v2.name(), v1.name());
        assert_eq!(SignedMetadata::decode(&v2.encode()).unwrap(), v2);
        // Version 2 naming the derived scheme is not canonical; an unknown version is named.
        let mut bad = enc.clone();
        *bad.last_mut().unwrap() = 1;
        assert!(Metadata::decode(&bad).is_err());
        let mut future = enc;
        future[4] = 3;
        let e = Metadata::decode(&future).unwrap_err().to_string();
        assert!(e.contains("version") && e.contains('3'), "{e}");
    }

    #[test]
    fn round_trip_and_name_is_stable() {
        let owner = OwnerKey::from_seed(&[3; 32]).unwrap();
        let s = sample(&owner, "demo");
        let enc = s.encode();
        assert_eq!(enc.len(), SignedMetadata::encoded_len(&enc).unwrap());
        let back = SignedMetadata::decode(&enc).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.name(), s.meta.name());
        assert_ne!(sample(&owner, "other").name(), s.name());
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let owner = OwnerKey::from_seed(&[3; 32]).unwrap();
        let enc = sample(&owner, "x").encode();
        for i in 0..enc.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = enc.clone();
                b[i] ^= bit;
                assert!(SignedMetadata::decode(&b).is_err(), "byte {i} bit {bit:#x}");
            }
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "must decode to itself")]
    fn encoding_metadata_decode_refuses_is_a_bug() {
        let owner = OwnerKey::from_seed(&[3; 32]).unwrap();
        let mut m = sample(&owner, "x").meta;
        m.policy.coordinators = 0;
        let _ = m.encode();
    }

    #[test]
    fn signature_by_someone_else_is_refused() {
        let owner = OwnerKey::from_seed(&[3; 32]).unwrap();
        let thief = OwnerKey::from_seed(&[4; 32]).unwrap();
        let s = sample(&owner, "x");
        assert_eq!(SignedMetadata::sign(s.meta.clone(), &thief.signing_key()), Err(MetadataError::Signature));
    }
}
