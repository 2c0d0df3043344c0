//! Writer certificates and revocations: how a capsule whose policy *certifies* writers learns
//! each writer's public key, and loses one writer without losing the others.
//!
//! In a certified capsule ([`WriterKeys::Certified`]) writer `w`'s key is the *hardened* child
//! `m/a'/w'` of the application key, so a leaked writer key reveals neither the application key
//! nor any sibling (with non-hardened children, one writer key and the public application
//! extended key give the application private key: BIP32's parent-recovery property). Verifiers
//! therefore cannot derive writer public keys; the application key signs a [`WriterCert`] per
//! writer instead, and a [`Revocation`] to retire one writer from an epoch on.
//!
//! Both travel as *key statements* in records of kind [`crate::Kind::Cert`], whose body is the
//! one body kept in the clear (it holds public keys and signatures only), so capsule servers,
//! CapsuleDB and auditors, which hold no data key, learn them from the log itself. A statement is
//! self-authenticating (the application key of its generation signs it), so any certified writer
//! may carry any statement; a writer's own certificate may ride in its own record, which is how a
//! new writer introduces itself. They can also be handed out of band (the leader's key bundle,
//! `psl keys cert` for `psl capsule append --writer`).
//!
//! Layouts (integers little-endian):
//!
//! ```text
//! certificate (158 bytes):
//!   [4] "PSLW" | u8 version (1) | [32] capsule name | u32 writer | u32 key_gen
//!   | [33] writer public key | u64 valid_from_epoch | u64 valid_until_epoch (u64::MAX: open)
//!   | [64] signature by the application key of generation key_gen over
//!          SHA-256("psl/writer-cert/v1" ‖ the 94 bytes before it)
//! revocation (125 bytes):
//!   [4] "PSLX" | u8 version (1) | [32] capsule name | u32 writer | u32 key_gen | u64 from_epoch
//!   | u64 from_seq (u64::MAX: no seq bound)
//!   | [64] signature by the application key of generation key_gen over
//!          SHA-256("psl/writer-revoke/v1" ‖ the 61 bytes before it)
//! statement list (a Cert record's body):
//!   u16 count (1 ..= STATEMENTS_PER_RECORD_MAX) | count × (u8 tag (1 cert, 2 revocation) | statement)
//! ```

use crate::codec::{DecodeError, Put, Reader};
use crate::meta::{CapsuleName, WriterKeys};
use psl_crypto::{sha256, AppKey, Hash256, Signature, SigningKey, VerifyingKey};

const CERT_MAGIC: &[u8; 4] = b"PSLW";
const REVOKE_MAGIC: &[u8; 4] = b"PSLX";
/// Version byte of both statement encodings (certificate and revocation); the decoder refuses any other.
pub const CERT_VERSION: u8 = 1;
const CERT_SIGNED_LEN: usize = 4 + 1 + 32 + 4 + 4 + 33 + 8 + 8;
/// Bytes of an encoded writer certificate.
pub const WRITER_CERT_LEN: usize = CERT_SIGNED_LEN + 64;
const REVOKE_SIGNED_LEN: usize = 4 + 1 + 32 + 4 + 4 + 8 + 8;
/// Bytes of an encoded revocation.
pub const REVOCATION_LEN: usize = REVOKE_SIGNED_LEN + 64;
const CERT_DOMAIN: &[u8] = b"psl/writer-cert/v1";
const REVOKE_DOMAIN: &[u8] = b"psl/writer-revoke/v1";
/// Most statements one Cert record carries (bounds its body at about 10 KiB).
pub const STATEMENTS_PER_RECORD_MAX: usize = 64;
/// `valid_until_epoch` of a certificate without an end.
pub const OPEN_ENDED: u64 = u64::MAX;

/// Signing keys under each scheme (beside the certificates a certified key needs; the type is
/// the metadata's, `meta::WriterKeys`).
impl WriterKeys {
    /// Writer `w`'s signing key under this scheme (the leader's and the development path's way
    /// to make a writer key; a certified writer also needs its certificate).
    pub fn signing_key(self, app: &AppKey, w: u32) -> Result<SigningKey, psl_crypto::CryptoError> {
        match self {
            WriterKeys::Derived => app.writer(w),
            WriterKeys::Certified => app.writer_hardened(w),
        }
    }
}

/// Writer `w`'s signing key in the capsule `meta` and, in a certified capsule, its certificate
/// (generation 0, from epoch 0, no end): how a role that holds the application key (the leader,
/// or a process started with `--owner` on the development path) equips one of its writers.
pub fn writer_credentials(
    meta: &crate::SignedMetadata,
    app: &AppKey,
    w: u32,
) -> Result<(SigningKey, Option<WriterCert>), psl_crypto::CryptoError> {
    match meta.meta.policy.writer_keys {
        WriterKeys::Derived => Ok((app.writer(w)?, None)),
        WriterKeys::Certified => {
            let cert =
                WriterCert::issue(app, meta.name(), 0, w, 0).map_err(|_| psl_crypto::CryptoError::WriterIndex(w))?;
            Ok((app.writer_hardened(w)?, Some(cert)))
        }
    }
}

/// "In capsule `capsule`, writer `writer` of key generation `key_gen` signs with `key`, for
/// records of epochs `valid_from_epoch .. valid_until_epoch`", signed by that generation's
/// application key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterCert {
    /// The capsule the certificate is valid in.
    pub capsule: CapsuleName,
    /// The certified writer index (below 2^31).
    pub writer: u32,
    /// The application key generation that signs the certificate and whose records it covers.
    pub key_gen: u32,
    /// The writer's public key, which verifies its records' signatures.
    pub key: VerifyingKey,
    /// First header epoch the certificate covers.
    pub valid_from_epoch: u64,
    /// First header epoch it no longer covers (exclusive; [`OPEN_ENDED`]: no end). Must be
    /// above `valid_from_epoch`.
    pub valid_until_epoch: u64,
    /// Signature by generation `key_gen`'s application key over
    /// `SHA-256("psl/writer-cert/v1" ‖ the 94 encoded bytes before it)`.
    pub signature: Signature,
}

/// "From epoch `from_epoch` on, and from seq `from_seq` of its chain on, writer `writer` of key
/// generation `key_gen` writes nothing valid in capsule `capsule`", signed by that generation's
/// application key. A record is refused if either bound holds. The seq bound closes what the
/// epoch bound alone leaves open: a record's epoch is the writer's claim, so a leaked key could
/// go on appending records that claim an epoch before `from_epoch`; its chain position it cannot
/// choose. [`ANY_SEQ`]: no seq bound (the issuer does not know how far the chain got).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// The capsule the revocation applies in.
    pub capsule: CapsuleName,
    /// The revoked writer index (below 2^31).
    pub writer: u32,
    /// The application key generation whose writer is revoked (and whose key signs this).
    pub key_gen: u32,
    /// First header epoch whose records of `(key_gen, writer)` are refused.
    pub from_epoch: u64,
    /// First seq of the writer's chain whose records are refused, whatever epoch they claim
    /// ([`ANY_SEQ`]: no seq bound).
    pub from_seq: u64,
    /// Signature by generation `key_gen`'s application key over
    /// `SHA-256("psl/writer-revoke/v1" ‖ the 61 encoded bytes before it)`.
    pub signature: Signature,
}

/// `Revocation::from_seq` without a seq bound.
pub const ANY_SEQ: u64 = u64::MAX;

/// One entry of a Cert record's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyStatement {
    /// A writer certificate (tag 1, 158 bytes).
    Cert(WriterCert),
    /// A revocation (tag 2, 125 bytes).
    Revoke(Revocation),
}

/// Why a certificate or revocation is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// The statement or statement list does not decode.
    #[error("key statement encoding: {0}")]
    Decode(#[from] DecodeError),
    /// The statement names another capsule.
    #[error("key statement is for capsule {found}, not this one")]
    Capsule {
        /// The capsule name the statement carries.
        found: Hash256,
    },
    /// The signature does not verify under the application key of the statement's generation.
    #[error("key statement for writer {writer} does not verify under the application key of generation {key_gen}")]
    Signature {
        /// The writer the statement is about.
        writer: u32,
        /// The key generation it names.
        key_gen: u32,
    },
    /// The statement names a key generation the verifier has no rotation certificate for.
    #[error("key statement names key generation {0}, which this verifier does not know")]
    KeyGeneration(u32),
    /// The writer index is 2^31 or more.
    #[error("writer {0} is not a writer index (must be below 2^31)")]
    Writer(u32),
    /// A certificate's window is empty (`valid_from_epoch >= valid_until_epoch`).
    #[error("certificate for writer {writer} has an empty validity window {from}..{until}")]
    Window {
        /// The certified writer.
        writer: u32,
        /// `valid_from_epoch`.
        from: u64,
        /// `valid_until_epoch`.
        until: u64,
    },
    /// A different certificate is already installed for the same `(key_gen, writer)`; a writer's
    /// key never changes in place.
    #[error("writer {writer} of key generation {key_gen} already has a different certificate")]
    Conflict {
        /// The certified writer.
        writer: u32,
        /// The key generation.
        key_gen: u32,
    },
    /// The capsule's writer keys are derived, so it accepts no statements.
    #[error("this capsule derives writer keys; it takes no writer certificates")]
    NotCertified,
    /// A verifier table is full: certificates, revoked writers, or revocations of one writer.
    #[error("more than {max} certificates or revocations (in all, or of one writer)")]
    TooMany {
        /// The bound that was reached.
        max: usize,
    },
}

/// The layout both statements open with: magic, version, capsule, writer, key generation.
fn put_prefix(b: &mut Vec<u8>, magic: &[u8; 4], capsule: &CapsuleName, writer: u32, key_gen: u32) {
    b.extend_from_slice(magic);
    b.put_u8(CERT_VERSION);
    b.extend_from_slice(&capsule.0 .0);
    b.put_u32(writer);
    b.put_u32(key_gen);
}

fn read_prefix(
    r: &mut Reader<'_>,
    magic: &[u8; 4],
    what: &'static str,
) -> Result<(CapsuleName, u32, u32), DecodeError> {
    if &r.array::<4>("statement magic")? != magic {
        return Err(DecodeError::Magic { what });
    }
    let v = r.u8("statement version")?;
    if v != CERT_VERSION {
        return Err(DecodeError::Version { what, found: v, supported: CERT_VERSION });
    }
    Ok((CapsuleName(Hash256(r.array("capsule")?)), r.u32("writer")?, r.u32("key generation")?))
}

/// Decodes exactly one statement of one kind from `bytes`.
fn decode_exact<T>(
    bytes: &[u8],
    what: &'static str,
    f: impl FnOnce(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    let mut r = Reader::new(bytes);
    let t = f(&mut r)?;
    r.finish(what)?;
    Ok(t)
}

fn check_writer(w: u32) -> Result<(), CertError> {
    if w >= 1 << 31 {
        return Err(CertError::Writer(w));
    }
    Ok(())
}

impl WriterCert {
    fn signed_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(WRITER_CERT_LEN);
        put_prefix(&mut b, CERT_MAGIC, &self.capsule, self.writer, self.key_gen);
        b.extend_from_slice(&self.key.to_bytes());
        b.put_u64(self.valid_from_epoch);
        b.put_u64(self.valid_until_epoch);
        b
    }

    fn digest(&self) -> Hash256 {
        sha256(&[CERT_DOMAIN, &self.signed_bytes()])
    }

    /// Issues the certificate of writer `writer`'s hardened key under `app` (the application
    /// key of generation `key_gen`), valid from `valid_from_epoch` on with no end.
    pub fn issue(
        app: &AppKey,
        capsule: CapsuleName,
        key_gen: u32,
        writer: u32,
        valid_from_epoch: u64,
    ) -> Result<WriterCert, CertError> {
        check_writer(writer)?;
        let key = app.writer_hardened(writer).map_err(|_| CertError::Writer(writer))?.verifying_key();
        Ok(Self::sign(app, capsule, key_gen, writer, key, valid_from_epoch, OPEN_ENDED))
    }

    /// Signs a certificate for any public key (a writer that made its own key pair).
    pub fn sign(
        app: &AppKey,
        capsule: CapsuleName,
        key_gen: u32,
        writer: u32,
        key: VerifyingKey,
        valid_from_epoch: u64,
        valid_until_epoch: u64,
    ) -> WriterCert {
        Self::sign_with(&app.signing_key(), capsule, key_gen, writer, key, valid_from_epoch, valid_until_epoch)
    }

    /// Signs with `signer`, which verifiers accept only if it is the application key of
    /// `key_gen` (tests use it to forge certificates that must be refused).
    pub fn sign_with(
        signer: &SigningKey,
        capsule: CapsuleName,
        key_gen: u32,
        writer: u32,
        key: VerifyingKey,
        valid_from_epoch: u64,
        valid_until_epoch: u64,
    ) -> WriterCert {
        let mut c = WriterCert {
            capsule,
            writer,
            key_gen,
            key,
            valid_from_epoch,
            valid_until_epoch,
            signature: Signature([0; 64]),
        };
        c.signature = signer.sign(&c.digest());
        c
    }

    /// Checks the signature under `app_point` (the application public key of `key_gen`) and the
    /// fields that need no other state.
    pub fn check(&self, capsule: CapsuleName, app_point: &VerifyingKey) -> Result<(), CertError> {
        if self.capsule != capsule {
            return Err(CertError::Capsule { found: self.capsule.0 });
        }
        check_writer(self.writer)?;
        if self.valid_from_epoch >= self.valid_until_epoch {
            return Err(CertError::Window {
                writer: self.writer,
                from: self.valid_from_epoch,
                until: self.valid_until_epoch,
            });
        }
        app_point
            .verify(&self.digest(), &self.signature)
            .map_err(|_| CertError::Signature { writer: self.writer, key_gen: self.key_gen })
    }

    /// Whether the certificate covers `epoch`.
    pub fn covers(&self, epoch: u64) -> bool {
        self.valid_from_epoch <= epoch && epoch < self.valid_until_epoch
    }

    /// The 158-byte encoding ([`WRITER_CERT_LEN`]): the signed fields, then the signature.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.signed_bytes();
        b.extend_from_slice(&self.signature.0);
        debug_assert_eq!(b.len(), WRITER_CERT_LEN);
        b
    }

    /// Decodes exactly one certificate. Checks the encoding only; see [`WriterCert::check`].
    pub fn decode(bytes: &[u8]) -> Result<WriterCert, DecodeError> {
        decode_exact(bytes, "writer certificate", Self::decode_from)
    }

    fn decode_from(r: &mut Reader<'_>) -> Result<WriterCert, DecodeError> {
        let (capsule, writer, key_gen) = read_prefix(r, CERT_MAGIC, "writer certificate")?;
        let key = VerifyingKey::from_bytes(r.take(33, "writer public key")?)
            .map_err(|_| DecodeError::Invalid { field: "writer public key", why: "not a secp256k1 point" })?;
        let valid_from_epoch = r.u64("valid_from_epoch")?;
        let valid_until_epoch = r.u64("valid_until_epoch")?;
        let signature = Signature(r.array("certificate signature")?);
        Ok(WriterCert { capsule, writer, key_gen, key, valid_from_epoch, valid_until_epoch, signature })
    }
}

impl Revocation {
    fn signed_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(REVOCATION_LEN);
        put_prefix(&mut b, REVOKE_MAGIC, &self.capsule, self.writer, self.key_gen);
        b.put_u64(self.from_epoch);
        b.put_u64(self.from_seq);
        b
    }

    fn digest(&self) -> Hash256 {
        sha256(&[REVOKE_DOMAIN, &self.signed_bytes()])
    }

    /// Whether a record of this writer at `epoch` and `seq` is refused.
    pub fn refuses(&self, epoch: u64, seq: u64) -> bool {
        epoch >= self.from_epoch || seq >= self.from_seq
    }

    /// Revokes writer `writer` of generation `key_gen` from `from_epoch` and from `from_seq`
    /// ([`ANY_SEQ`]: no seq bound) on.
    pub fn issue(
        app: &AppKey,
        capsule: CapsuleName,
        key_gen: u32,
        writer: u32,
        from_epoch: u64,
        from_seq: u64,
    ) -> Result<Revocation, CertError> {
        check_writer(writer)?;
        let mut r = Revocation { capsule, writer, key_gen, from_epoch, from_seq, signature: Signature([0; 64]) };
        r.signature = app.signing_key().sign(&r.digest());
        Ok(r)
    }

    /// Checks the capsule, the writer index and the signature under `app_point` (the
    /// application public key of `key_gen`); errors `Capsule`, `Writer` or `Signature`.
    pub fn check(&self, capsule: CapsuleName, app_point: &VerifyingKey) -> Result<(), CertError> {
        if self.capsule != capsule {
            return Err(CertError::Capsule { found: self.capsule.0 });
        }
        check_writer(self.writer)?;
        app_point
            .verify(&self.digest(), &self.signature)
            .map_err(|_| CertError::Signature { writer: self.writer, key_gen: self.key_gen })
    }

    /// The 125-byte encoding ([`REVOCATION_LEN`]): the signed fields, then the signature.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.signed_bytes();
        b.extend_from_slice(&self.signature.0);
        debug_assert_eq!(b.len(), REVOCATION_LEN);
        b
    }

    /// Decodes exactly one revocation. Checks the encoding only; see [`Revocation::check`].
    pub fn decode(bytes: &[u8]) -> Result<Revocation, DecodeError> {
        decode_exact(bytes, "revocation", Self::decode_from)
    }

    fn decode_from(r: &mut Reader<'_>) -> Result<Revocation, DecodeError> {
        let (capsule, writer, key_gen) = read_prefix(r, REVOKE_MAGIC, "revocation")?;
        let from_epoch = r.u64("from_epoch")?;
        let from_seq = r.u64("from_seq")?;
        let signature = Signature(r.array("revocation signature")?);
        Ok(Revocation { capsule, writer, key_gen, from_epoch, from_seq, signature })
    }
}

impl KeyStatement {
    /// The writer index the statement is about.
    pub fn writer(&self) -> u32 {
        match self {
            KeyStatement::Cert(c) => c.writer,
            KeyStatement::Revoke(r) => r.writer,
        }
    }

    /// The key generation the statement names (and whose application key must sign it).
    pub fn key_gen(&self) -> u32 {
        match self {
            KeyStatement::Cert(c) => c.key_gen,
            KeyStatement::Revoke(r) => r.key_gen,
        }
    }

    /// Checks the statement's signature under `app_point`, its generation's application key.
    pub fn check(&self, capsule: CapsuleName, app_point: &VerifyingKey) -> Result<(), CertError> {
        match self {
            KeyStatement::Cert(c) => c.check(capsule, app_point),
            KeyStatement::Revoke(r) => r.check(capsule, app_point),
        }
    }

    /// Encodes a statement list (a Cert record's body). Panics on an empty or over-long list:
    /// callers build lists within [`STATEMENTS_PER_RECORD_MAX`] (`Body::check` enforces it).
    pub fn encode_list(list: &[KeyStatement]) -> Vec<u8> {
        assert!(!list.is_empty() && list.len() <= STATEMENTS_PER_RECORD_MAX, "statement count checked by the caller");
        let mut b = Vec::with_capacity(2 + list.len() * (1 + WRITER_CERT_LEN));
        b.put_u16(list.len() as u16);
        for s in list {
            match s {
                KeyStatement::Cert(c) => {
                    b.put_u8(1);
                    b.extend_from_slice(&c.encode());
                }
                KeyStatement::Revoke(r) => {
                    b.put_u8(2);
                    b.extend_from_slice(&r.encode());
                }
            }
        }
        b
    }

    /// Decodes a statement list that fills `bytes` exactly. Never panics.
    pub fn decode_list(bytes: &[u8]) -> Result<Vec<KeyStatement>, DecodeError> {
        let mut r = Reader::new(bytes);
        let n = r.u16("statement count")? as usize;
        if n == 0 {
            return Err(DecodeError::Invalid { field: "statement count", why: "a Cert record carries at least one" });
        }
        if n > STATEMENTS_PER_RECORD_MAX {
            return Err(DecodeError::Limit {
                field: "statement count",
                len: n as u64,
                max: STATEMENTS_PER_RECORD_MAX as u64,
            });
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let tag = r.u8("statement tag")?;
            out.push(match tag {
                1 => KeyStatement::Cert(WriterCert::decode_from(&mut r)?),
                2 => KeyStatement::Revoke(Revocation::decode_from(&mut r)?),
                t => return Err(DecodeError::Tag { field: "statement tag", value: t as u64 }),
            });
        }
        r.finish("statement list")?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use psl_crypto::OwnerKey;

    fn name() -> CapsuleName {
        CapsuleName(sha256(&[b"capsule"]))
    }

    #[test]
    fn issue_check_round_trip() {
        let owner = OwnerKey::from_seed(&[5; 32]).unwrap();
        let app = owner.app(2).unwrap();
        let point = app.public().point();
        let c = WriterCert::issue(&app, name(), 0, 12, 3).unwrap();
        assert_eq!(c.key, app.writer_hardened(12).unwrap().verifying_key());
        assert_ne!(c.key, app.public().writer(12).unwrap(), "a certified writer is not the derived child");
        c.check(name(), &point).unwrap();
        let enc = c.encode();
        assert_eq!(enc.len(), WRITER_CERT_LEN);
        assert_eq!(WriterCert::decode(&enc).unwrap(), c);
        assert!(c.covers(3) && c.covers(u64::MAX - 1) && !c.covers(2));
        let r = Revocation::issue(&app, name(), 0, 12, 9, 40).unwrap();
        assert!(r.refuses(9, 0) && r.refuses(3, 40) && !r.refuses(8, 39));
        r.check(name(), &point).unwrap();
        assert_eq!(Revocation::decode(&r.encode()).unwrap(), r);
        let list = vec![KeyStatement::Cert(c.clone()), KeyStatement::Revoke(r.clone())];
        assert_eq!(KeyStatement::decode_list(&KeyStatement::encode_list(&list)).unwrap(), list);
        // Signed by another application key, or for another capsule: refused.
        let other = owner.app(3).unwrap();
        assert!(matches!(c.check(name(), &other.public().point()), Err(CertError::Signature { .. })));
        assert!(matches!(c.check(CapsuleName(sha256(&[b"x"])), &point), Err(CertError::Capsule { .. })));
        let mut moved = c.clone();
        moved.writer = 13;
        assert!(moved.check(name(), &point).is_err(), "the signature covers the writer index");
        let mut widened = c;
        widened.valid_from_epoch = 0;
        assert!(widened.check(name(), &point).is_err(), "the signature covers the window");
        assert!(WriterCert::issue(&app, name(), 0, 1 << 31, 0).is_err());
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let owner = OwnerKey::from_seed(&[6; 32]).unwrap();
        let app = owner.app(2).unwrap();
        let point = app.public().point();
        let enc = WriterCert::issue(&app, name(), 0, 4, 0).unwrap().encode();
        for i in 0..enc.len() {
            let mut b = enc.clone();
            b[i] ^= 0x10;
            assert!(
                WriterCert::decode(&b).map_err(CertError::from).and_then(|c| c.check(name(), &point)).is_err(),
                "byte {i}"
            );
        }
    }

    proptest! {
        #[test]
        fn decode_list_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..800)) {
            let _ = KeyStatement::decode_list(&bytes);
        }

        #[test]
        fn list_round_trips(writers in proptest::collection::vec((0u32..(1 << 31), any::<bool>(), any::<u64>()), 1..8)) {
            let owner = OwnerKey::from_seed(&[7; 32]).unwrap();
            let app = owner.app(1).unwrap();
            let list: Vec<_> = writers.iter().map(|&(w, revoke, e)| if revoke {
                KeyStatement::Revoke(Revocation::issue(&app, name(), 0, w, e, e / 3).unwrap())
            } else {
                KeyStatement::Cert(WriterCert::sign(&app, name(), 0, w, app.signing_key().verifying_key(), e / 2, e / 2 + 1))
            }).collect();
            let enc = KeyStatement::encode_list(&list);
            prop_assert_eq!(KeyStatement::decode_list(&enc).unwrap(), list.clone());
            for s in &list {
                prop_assert!(s.check(name(), &app.public().point()).is_ok());
            }
            // Truncations never decode.
            for cut in [1usize, 7, 60] {
                if cut < enc.len() {
                    prop_assert!(KeyStatement::decode_list(&enc[..enc.len() - cut]).is_err());
                }
            }
        }
    }
}
