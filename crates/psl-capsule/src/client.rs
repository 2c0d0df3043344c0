//! Client credentials: "the holder of `key` may read (write, run) in capsule `capsule` until
//! `expires_ms`", signed by the capsule's owner master key (`psl keys client`).
//!
//! A trusted role's HTTPS API (docs/client.md) takes a request only with such a certificate and
//! a signature by its key over the request; the role checks the certificate against the owner
//! key in the capsule's signed metadata, so no list of clients is kept anywhere and a role needs
//! nothing but the metadata it already holds.
//!
//! Layout (integers little-endian, 151 bytes):
//!
//! ```text
//!   [4] "PSLU" | u8 version (1) | [32] capsule name | [33] client public key (secp256k1,
//!   compressed) | u8 permissions (1 read, 2 write, 4 run) | u64 issued_ms | u64 expires_ms
//!   (u64::MAX: no end) | [64] signature by the owner master key over
//!   SHA-256("psl/client-cert/v1" ‖ the 87 bytes before it)
//! ```

use crate::codec::{DecodeError, Put, Reader};
use crate::meta::CapsuleName;
use psl_crypto::{sha256, Hash256, OwnerPublicKey, Signature, SigningKey, VerifyingKey};

const MAGIC: &[u8; 4] = b"PSLU";
const VERSION: u8 = 1;
const SIGNED_LEN: usize = 4 + 1 + 32 + 33 + 1 + 8 + 8;
/// Bytes of an encoded client certificate.
pub const CLIENT_CERT_LEN: usize = SIGNED_LEN + 64;
const DOMAIN: &[u8] = b"psl/client-cert/v1";
/// `expires_ms` of a certificate without an end.
pub const NO_EXPIRY: u64 = u64::MAX;

/// What a client may do: a set of [`Permissions::READ`], [`Permissions::WRITE`] and
/// [`Permissions::RUN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Permissions(u8);

impl Permissions {
    /// Read keys (get, scan) and wait for a sync.
    pub const READ: Permissions = Permissions(1);
    /// Write keys (put, delete, compare-and-set).
    pub const WRITE: Permissions = Permissions(2);
    /// Run jobs.
    pub const RUN: Permissions = Permissions(4);
    const NAMES: [(&'static str, Permissions); 3] =
        [("read", Permissions::READ), ("write", Permissions::WRITE), ("run", Permissions::RUN)];

    /// Parses `read,write,run` (any non-empty subset, any order).
    pub fn parse(s: &str) -> Result<Permissions, String> {
        let mut p = Permissions(0);
        for part in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            match Self::NAMES.iter().find(|(n, _)| *n == part) {
                Some((_, q)) => p.0 |= q.0,
                None => return Err(format!("unknown permission {part:?}: use read, write and run")),
            }
        }
        if p.0 == 0 {
            return Err("no permission given: use one or more of read, write, run".into());
        }
        Ok(p)
    }

    /// Whether every permission of `other` is in `self`.
    pub fn allows(self, other: Permissions) -> bool {
        self.0 & other.0 == other.0
    }

    /// The names, in the order read, write, run.
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES.iter().filter(|(_, q)| self.allows(*q)).map(|(n, _)| *n).collect()
    }

    /// The encoded byte.
    pub fn bits(self) -> u8 {
        self.0
    }
}

/// Why a client certificate is not accepted. [`ClientCertError::status`] says which HTTP answer
/// each is: a certificate that is not the owner's (or has lapsed) authenticates nobody (401);
/// one that is the owner's but for another capsule or without the permission is a known client
/// asking for what it may not do (403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientCertError {
    /// The bytes are not a certificate.
    #[error("client certificate encoding: {0}")]
    Decode(#[from] DecodeError),
    /// The owner key of this capsule did not sign it.
    #[error("client certificate is not signed by this capsule's owner key")]
    Signature,
    /// It expired.
    #[error("client certificate expired at {expires_ms} ms (now {now_ms} ms)")]
    Expired {
        /// Its end.
        expires_ms: u64,
        /// The checker's clock.
        now_ms: u64,
    },
    /// It is for another capsule.
    #[error("client certificate is for capsule {found}, not {expected}")]
    Capsule {
        /// The capsule it names.
        found: CapsuleName,
        /// The capsule served here.
        expected: CapsuleName,
    },
    /// It does not carry the permission the request needs.
    #[error("client certificate allows {has:?}; this request needs {needs:?}")]
    Permission {
        /// What it allows.
        has: Vec<&'static str>,
        /// What the request needs.
        needs: Vec<&'static str>,
    },
}

impl ClientCertError {
    /// 401 (not authenticated) or 403 (authenticated, not allowed).
    pub fn status(&self) -> u16 {
        match self {
            ClientCertError::Capsule { .. } | ClientCertError::Permission { .. } => 403,
            _ => 401,
        }
    }
}

/// An owner-signed client certificate (see the module docs for its layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The capsule it is valid in.
    pub capsule: CapsuleName,
    /// The client's public key, which verifies its request signatures.
    pub key: VerifyingKey,
    /// What the client may do.
    pub can: Permissions,
    /// When it was issued (ms since the Unix epoch).
    pub issued_ms: u64,
    /// When it ends (ms since the Unix epoch; [`NO_EXPIRY`]: never).
    pub expires_ms: u64,
    /// The owner master key's signature.
    pub signature: Signature,
}

impl ClientCert {
    fn signed_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CLIENT_CERT_LEN);
        b.extend_from_slice(MAGIC);
        b.put_u8(VERSION);
        b.extend_from_slice(&self.capsule.0 .0);
        b.extend_from_slice(&self.key.to_bytes());
        b.put_u8(self.can.0);
        b.put_u64(self.issued_ms);
        b.put_u64(self.expires_ms);
        debug_assert_eq!(b.len(), SIGNED_LEN);
        b
    }

    fn digest(&self) -> Hash256 {
        sha256(&[DOMAIN, &self.signed_bytes()])
    }

    /// Signs a certificate for `key` with `owner` (the capsule's owner master signing key).
    pub fn issue(
        owner: &SigningKey,
        capsule: CapsuleName,
        key: VerifyingKey,
        can: Permissions,
        issued_ms: u64,
        expires_ms: u64,
    ) -> ClientCert {
        let mut c = ClientCert { capsule, key, can, issued_ms, expires_ms, signature: Signature([0; 64]) };
        c.signature = owner.sign(&c.digest());
        c
    }

    /// Checks that `owner` signed it, that it is for `capsule`, unexpired at `now_ms`, and
    /// allows `needs`. The signature is checked first, so a forged certificate is always a 401
    /// whatever it claims.
    pub fn check(
        &self,
        capsule: CapsuleName,
        owner: &OwnerPublicKey,
        now_ms: u64,
        needs: Permissions,
    ) -> Result<(), ClientCertError> {
        self.check_signature(owner)?;
        self.check_use(capsule, now_ms, needs)
    }

    /// Checks only that `owner` signed it (what a verifier may cache per certificate).
    pub fn check_signature(&self, owner: &OwnerPublicKey) -> Result<(), ClientCertError> {
        owner.0.verify(&self.digest(), &self.signature).map_err(|_| ClientCertError::Signature)
    }

    /// Checks the rest of [`ClientCert::check`]: the capsule, the expiry at `now_ms` and the
    /// permission, for a certificate whose signature was checked.
    pub fn check_use(&self, capsule: CapsuleName, now_ms: u64, needs: Permissions) -> Result<(), ClientCertError> {
        if now_ms >= self.expires_ms {
            return Err(ClientCertError::Expired { expires_ms: self.expires_ms, now_ms });
        }
        if self.capsule != capsule {
            return Err(ClientCertError::Capsule { found: self.capsule, expected: capsule });
        }
        if !self.can.allows(needs) {
            return Err(ClientCertError::Permission { has: self.can.names(), needs: needs.names() });
        }
        Ok(())
    }

    /// The [`CLIENT_CERT_LEN`]-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.signed_bytes();
        b.extend_from_slice(&self.signature.0);
        debug_assert_eq!(b.len(), CLIENT_CERT_LEN);
        b
    }

    /// Decodes exactly one certificate. Checks the encoding only; see [`ClientCert::check`].
    pub fn decode(bytes: &[u8]) -> Result<ClientCert, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.take(4, "client certificate magic")? != MAGIC {
            return Err(DecodeError::Invalid { field: "client certificate magic", why: "not PSLU" });
        }
        if r.u8("client certificate version")? != VERSION {
            return Err(DecodeError::Invalid { field: "client certificate version", why: "only version 1 is known" });
        }
        let capsule = CapsuleName(Hash256(r.array("capsule name")?));
        let key = VerifyingKey::from_bytes(r.take(33, "client public key")?)
            .map_err(|_| DecodeError::Invalid { field: "client public key", why: "not a secp256k1 point" })?;
        let can = r.u8("permissions")?;
        if can == 0 || can & !7 != 0 {
            return Err(DecodeError::Invalid { field: "permissions", why: "not a non-empty set of read, write, run" });
        }
        let issued_ms = r.u64("issued_ms")?;
        let expires_ms = r.u64("expires_ms")?;
        let signature = Signature(r.array("client certificate signature")?);
        r.finish("client certificate")?;
        Ok(ClientCert { capsule, key, can: Permissions(can), issued_ms, expires_ms, signature })
    }
}

/// The digest a client signs for one HTTPS request (docs/client.md, "Requests"):
/// `SHA-256("psl/http-request/v1" ‖ server_spki_hash ‖ nonce ‖ request_hash)`. Binding the
/// server's TLS key keeps a signed request from being replayed to another endpoint.
pub fn request_digest(server_spki_hash: &[u8; 32], nonce: &[u8; 32], request_hash: &[u8; 32]) -> Hash256 {
    sha256(&[b"psl/http-request/v1", server_spki_hash, nonce, request_hash])
}

/// `SHA-256(METHOD ‖ "\n" ‖ PATH_AND_QUERY ‖ "\n" ‖ BODY)`: what a request signature and an
/// answer signature both cover of the request.
pub fn request_hash(method: &str, path_and_query: &str, body: &[u8]) -> [u8; 32] {
    sha256(&[method.as_bytes(), b"\n", path_and_query.as_bytes(), b"\n", body]).0
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_crypto::OwnerKey;

    fn owner() -> OwnerKey {
        OwnerKey::from_seed(&[7; 32]).unwrap()
    }

    fn cert(o: &OwnerKey, can: &str) -> (SigningKey, ClientCert) {
        let client = SigningKey::from_bytes(&[9; 32]).unwrap();
        let c = ClientCert::issue(
            &o.signing_key(),
            CapsuleName(Hash256([1; 32])),
            client.verifying_key(),
            Permissions::parse(can).unwrap(),
            10,
            NO_EXPIRY,
        );
        (client, c)
    }

    #[test]
    fn an_owner_signed_certificate_checks_and_round_trips() {
        let o = owner();
        let (_, c) = cert(&o, "read,write");
        assert_eq!(c.encode().len(), CLIENT_CERT_LEN);
        assert_eq!(ClientCert::decode(&c.encode()).unwrap(), c);
        let cap = CapsuleName(Hash256([1; 32]));
        c.check(cap, &o.public(), 1000, Permissions::WRITE).unwrap();
        c.check(cap, &o.public(), 1000, Permissions::READ).unwrap();
    }

    #[test]
    fn forged_foreign_lapsed_and_narrow_certificates_are_refused_with_their_status() {
        let o = owner();
        let cap = CapsuleName(Hash256([1; 32]));
        let (_, c) = cert(&o, "read");
        let e = c.check(cap, &o.public(), 5, Permissions::WRITE).unwrap_err();
        assert!(matches!(e, ClientCertError::Permission { .. }) && e.status() == 403, "{e}");
        let e = c.check(CapsuleName(Hash256([2; 32])), &o.public(), 5, Permissions::READ).unwrap_err();
        assert!(matches!(e, ClientCertError::Capsule { .. }) && e.status() == 403, "{e}");
        // Another owner's signature (a self-made certificate): 401 whatever it claims.
        let mallory = OwnerKey::from_seed(&[8; 32]).unwrap();
        let (_, forged) = cert(&mallory, "read,write,run");
        let e = forged.check(cap, &o.public(), 5, Permissions::READ).unwrap_err();
        assert_eq!((e.clone(), e.status()), (ClientCertError::Signature, 401));
        // Widening the permissions of a genuine certificate breaks its signature.
        let mut widened = c.clone();
        widened.can = Permissions::parse("read,write").unwrap();
        assert_eq!(widened.check(cap, &o.public(), 5, Permissions::WRITE), Err(ClientCertError::Signature));
        let mut lapsed = ClientCert::issue(&o.signing_key(), cap, c.key, c.can, 1, 100);
        assert!(matches!(lapsed.check(cap, &o.public(), 100, Permissions::READ), Err(ClientCertError::Expired { .. })));
        lapsed.expires_ms = NO_EXPIRY;
        assert_eq!(lapsed.check(cap, &o.public(), 100, Permissions::READ), Err(ClientCertError::Signature));
    }

    #[test]
    fn permissions_parse_and_bad_bytes_do_not_decode() {
        assert!(Permissions::parse("read,admin").is_err());
        assert!(Permissions::parse("").is_err());
        assert_eq!(Permissions::parse("run, read").unwrap().names(), vec!["read", "run"]);
        let (_, c) = cert(&owner(), "read");
        let mut b = c.encode();
        b[4 + 1 + 32 + 33] = 8; // an unknown permission bit
        assert!(ClientCert::decode(&b).is_err());
        assert!(ClientCert::decode(&c.encode()[..100]).is_err());
        let mut long = c.encode();
        long.push(0);
        assert!(ClientCert::decode(&long).is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_without_panicking(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = ClientCert::decode(&b);
        }
    }
}
