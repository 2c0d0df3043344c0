//! Application key rotation: the owner-signed certificate that names a capsule's next
//! application key generation and the epoch from which it is in force.
//!
//! Generation 0 is the application key named in the capsule metadata. Generation `g >= 1` is a
//! new *hardened* child `m/app_index'` of the owner master key, announced by a [`RotationCert`]
//! that the owner key signs (the leader holds the owner key for the job). A record header's
//! `key_gen` names the generation whose writer key signed it and whose data key sealed it.
//!
//! Rules (checked by the [`crate::Verifier`]): a record of generation `g` is valid only for
//! header epochs in `[from_epoch(g), from_epoch(g + 1))`. Below the window the key is not yet in
//! force; at or above the next generation's `from_epoch` the key is *retired* and the record is
//! refused, so a stolen retired key cannot write into the present. Records from before the
//! rotation epoch stay valid: the log's history remains verifiable with the public keys of
//! every generation.
//!
//! Layout (214 bytes, integers little-endian):
//!
//! ```text
//! [4] "PSLK" | u8 version (1) | [32] capsule name | u32 key_gen | u32 app_index
//! | [65] application extended public key | [32] data key fingerprint | u64 from_epoch
//! | [64] owner signature over SHA-256("psl/rotation/v1" ‖ the 150 bytes before it)
//! ```

use crate::codec::{DecodeError, Put, Reader};
use crate::meta::{CapsuleName, SignedMetadata};
use psl_crypto::{sha256, AppPublicKey, Hash256, OwnerKey, Signature};

const MAGIC: &[u8; 4] = b"PSLK";
/// Version byte of the rotation certificate encoding; the decoder refuses any other.
pub const ROTATION_VERSION: u8 = 1;
/// Bytes of the signed part.
const SIGNED_LEN: usize = 4 + 1 + 32 + 4 + 4 + 65 + 32 + 8;
/// Bytes of an encoded certificate.
pub const ROTATION_CERT_LEN: usize = SIGNED_LEN + 64;
const DOMAIN: &[u8] = b"psl/rotation/v1";
/// Most key generations a capsule may have (bounds every per-generation table).
pub const KEY_GENERATIONS_MAX: u32 = 1024;

/// "From epoch `from_epoch` on, application key generation `key_gen` of capsule `capsule` is
/// the hardened child `app_index` with public key `app` and data key `data_key_fp`", signed by
/// the capsule owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationCert {
    /// The capsule whose application key rotates.
    pub capsule: CapsuleName,
    /// The generation announced: 1 to [`KEY_GENERATIONS_MAX`] - 1, the newest known plus one.
    pub key_gen: u32,
    /// Hardened child index `a_g` of the new application key under the owner master key: below
    /// 2^31 and used by no earlier generation of this capsule (nor the metadata).
    pub app_index: u32,
    /// Extended public key of `m/app_index'`, which verifies this generation's writer keys or
    /// writer certificates.
    pub app: AppPublicKey,
    /// Fingerprint of this generation's data key (`SHA-256("psl/data-key-fp/v1" ‖ key)`).
    pub data_key_fp: Hash256,
    /// The rotation epoch: the first header epoch at which this generation is in force (and
    /// the previous one retired); above the previous generation's.
    pub from_epoch: u64,
    /// The owner master key's signature over `SHA-256("psl/rotation/v1" ‖ the 150 encoded
    /// bytes before it)`.
    pub signature: Signature,
}

/// Why a rotation certificate is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RotationError {
    /// The certificate does not decode.
    #[error("rotation certificate encoding: {0}")]
    Decode(#[from] DecodeError),
    /// The certificate names another capsule.
    #[error("rotation certificate is for capsule {found}, not this one")]
    Capsule {
        /// The capsule name the certificate carries.
        found: Hash256,
    },
    /// The signature does not verify under the metadata's owner key (when issuing: the owner
    /// key given is not the capsule's).
    #[error("rotation certificate signature does not verify under the capsule owner's key")]
    Signature,
    /// The generation is 0, at or above [`KEY_GENERATIONS_MAX`], or not the newest known plus one.
    #[error("rotation to key generation {found} does not follow the newest known generation {newest}")]
    Generation {
        /// The generation the certificate names.
        found: u32,
        /// The newest generation the verifier holds (0 when checked without a verifier).
        newest: u32,
    },
    /// The rotation epoch is not above the previous generation's `from_epoch`.
    #[error("rotation epoch {found} is not after the previous generation's first epoch {previous}")]
    Epoch {
        /// The certificate's `from_epoch`.
        found: u64,
        /// The previous generation's `from_epoch` (0 for generation 0).
        previous: u64,
    },
    /// The application index is 2^31 or more, or already used by this capsule's metadata or an
    /// earlier generation.
    #[error("the application index {0} is not a fresh hardened child (below 2^31 and unused by this capsule)")]
    AppIndex(u32),
    /// The verifier already holds a different certificate for this generation.
    #[error("key generation {0} is already known with a different certificate")]
    Conflict(u32),
    /// The data key passed with the certificate does not match its `data_key_fp`.
    #[error("the data key handed over does not match the certificate's fingerprint")]
    DataKey,
    /// The capsule would have more than [`KEY_GENERATIONS_MAX`] key generations (generation 0 included).
    #[error("more than {KEY_GENERATIONS_MAX} key generations")]
    TooMany,
}

impl RotationCert {
    fn signed_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(ROTATION_CERT_LEN);
        b.extend_from_slice(MAGIC);
        b.put_u8(ROTATION_VERSION);
        b.extend_from_slice(&self.capsule.0 .0);
        b.put_u32(self.key_gen);
        b.put_u32(self.app_index);
        b.extend_from_slice(&self.app.to_bytes());
        b.extend_from_slice(&self.data_key_fp.0);
        b.put_u64(self.from_epoch);
        b
    }

    fn digest(&self) -> Hash256 {
        sha256(&[DOMAIN, &self.signed_bytes()])
    }

    /// Derives generation `key_gen`'s application key `m/app_index'` from the owner key and signs
    /// the certificate for it. Returns the certificate; the caller derives the secret keys again
    /// from `owner.app(app_index)` (see `psl_faas::rotation`).
    pub fn issue(
        owner: &OwnerKey,
        meta: &SignedMetadata,
        key_gen: u32,
        app_index: u32,
        from_epoch: u64,
    ) -> Result<RotationCert, RotationError> {
        if owner.public() != meta.meta.owner {
            return Err(RotationError::Signature);
        }
        if app_index == meta.meta.app_index {
            return Err(RotationError::AppIndex(app_index));
        }
        let app = owner.app(app_index).map_err(|_| RotationError::AppIndex(app_index))?;
        let mut cert = RotationCert {
            capsule: meta.name(),
            key_gen,
            app_index,
            app: app.public(),
            data_key_fp: app.data_key().fingerprint(),
            from_epoch,
            signature: Signature([0; 64]),
        };
        cert.signature = owner.signing_key().sign(&cert.digest());
        Ok(cert)
    }

    /// Checks the owner's signature and that the certificate is for `meta`'s capsule, with a
    /// generation in `1..KEY_GENERATIONS_MAX` and an application index other than the metadata's.
    /// The checks against earlier generations are the verifier's (`Verifier::install_rotation`).
    pub fn check(&self, meta: &SignedMetadata) -> Result<(), RotationError> {
        if self.capsule != meta.name() {
            return Err(RotationError::Capsule { found: self.capsule.0 });
        }
        if self.key_gen == 0 || self.key_gen >= KEY_GENERATIONS_MAX {
            return Err(RotationError::Generation { found: self.key_gen, newest: 0 });
        }
        if self.app_index == meta.meta.app_index || self.app_index >= 1 << 31 {
            return Err(RotationError::AppIndex(self.app_index));
        }
        meta.meta.owner.0.verify(&self.digest(), &self.signature).map_err(|_| RotationError::Signature)
    }

    /// The 214-byte encoding ([`ROTATION_CERT_LEN`]): the signed fields, then the signature.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.signed_bytes();
        b.extend_from_slice(&self.signature.0);
        debug_assert_eq!(b.len(), ROTATION_CERT_LEN);
        b
    }

    /// Decodes the layout only (no signature check: see [`RotationCert::check`]). Never panics.
    pub fn decode(bytes: &[u8]) -> Result<RotationCert, DecodeError> {
        if bytes.len() > ROTATION_CERT_LEN {
            return Err(DecodeError::Limit {
                field: "rotation certificate",
                len: bytes.len() as u64,
                max: ROTATION_CERT_LEN as u64,
            });
        }
        let mut r = Reader::new(bytes);
        if &r.array::<4>("rotation magic")? != MAGIC {
            return Err(DecodeError::Magic { what: "rotation certificate" });
        }
        let v = r.u8("rotation version")?;
        if v != ROTATION_VERSION {
            return Err(DecodeError::Version { what: "rotation certificate", found: v, supported: ROTATION_VERSION });
        }
        let capsule = CapsuleName(Hash256(r.array("capsule")?));
        let key_gen = r.u32("key generation")?;
        let app_index = r.u32("application index")?;
        if app_index >= 1 << 31 {
            return Err(DecodeError::Invalid { field: "application index", why: "must be below 2^31" });
        }
        let app = AppPublicKey::from_bytes(r.take(65, "application public key")?)
            .map_err(|_| DecodeError::Invalid { field: "application public key", why: "not a secp256k1 point" })?;
        let data_key_fp = Hash256(r.array("data key fingerprint")?);
        let from_epoch = r.u64("rotation epoch")?;
        let signature = Signature(r.array("rotation signature")?);
        r.finish("rotation certificate")?;
        Ok(RotationCert { capsule, key_gen, app_index, app, data_key_fp, from_epoch, signature })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::tests::sample;

    #[test]
    fn issue_check_round_trip_and_every_flipped_bit_refused() {
        let owner = OwnerKey::from_seed(&[5; 32]).unwrap();
        let meta = sample(&owner, "rot");
        let cert = RotationCert::issue(&owner, &meta, 1, 8, 1 << 20).unwrap();
        cert.check(&meta).unwrap();
        assert_eq!(cert.app, owner.app(8).unwrap().public());
        let enc = cert.encode();
        assert_eq!(enc.len(), ROTATION_CERT_LEN);
        assert_eq!(RotationCert::decode(&enc).unwrap(), cert);
        for i in 0..enc.len() {
            let mut b = enc.clone();
            b[i] ^= 0x01;
            let ok = RotationCert::decode(&b).map(|c| c.check(&meta).is_ok()).unwrap_or(false);
            assert!(!ok, "byte {i}");
        }
        for cut in 0..enc.len() {
            assert!(RotationCert::decode(&enc[..cut]).is_err());
        }
    }

    #[test]
    fn foreign_owner_other_capsule_and_reused_index_refused() {
        let owner = OwnerKey::from_seed(&[5; 32]).unwrap();
        let thief = OwnerKey::from_seed(&[6; 32]).unwrap();
        let meta = sample(&owner, "rot");
        assert_eq!(RotationCert::issue(&thief, &meta, 1, 8, 10), Err(RotationError::Signature));
        // A thief's certificate with the owner's name on it does not verify.
        let other = sample(&thief, "rot");
        let mut forged = RotationCert::issue(&thief, &other, 1, 8, 10).unwrap();
        forged.capsule = meta.name();
        assert_eq!(forged.check(&meta), Err(RotationError::Signature));
        let cert = RotationCert::issue(&owner, &meta, 1, 8, 10).unwrap();
        assert!(matches!(cert.check(&sample(&owner, "elsewhere")), Err(RotationError::Capsule { .. })));
        assert_eq!(RotationCert::issue(&owner, &meta, 1, meta.meta.app_index, 10), Err(RotationError::AppIndex(7)));
    }
}
