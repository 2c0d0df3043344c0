//! ECDSA over secp256k1 (libsecp256k1). Signatures are 64-byte compact `r || s` with low `s`:
//! the verifier refuses the `s -> n - s` twin, so nobody but the key holder can make a second
//! valid signature of a record. (Record hashes do not cover the signature in any case.)

use crate::{CryptoError, Hash256};
use std::fmt;

pub const SIGNATURE_LEN: usize = 64;
pub const PUBLIC_KEY_LEN: usize = 33;

/// A 64-byte compact ECDSA signature as it travels on the wire. Not checked until verified.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature(pub [u8; SIGNATURE_LEN]);

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({}…)", hex::encode(&self.0[..6]))
    }
}

/// Signatures a thread's signing context makes between two re-blindings.
const REBLIND_EVERY: u32 = 64;

/// A thread's libsecp256k1 signing context. libsecp256k1 blinds its fixed-base multiplication
/// (`k * G`, the secret-dependent part of signing) with a random value held in the context,
/// against side channels beyond timing, which its constant-time code already closes. The
/// `secp256k1` crate's `ecdsa::sign` uses a global context that it re-blinds after *every*
/// signature, which costs about as much as the signature itself; writers and CapsuleDB sign
/// one record after another, so here each thread keeps its own context, blinded with fresh
/// randomness when created and again every [`REBLIND_EVERY`] signatures.
struct Signer {
    ctx: secp256k1::Secp256k1<secp256k1::SignOnly>,
    signatures: u32,
}

thread_local! {
    static SIGNER: std::cell::RefCell<Signer> = std::cell::RefCell::new(Signer {
        ctx: {
            let mut ctx = secp256k1::Secp256k1::signing_only();
            ctx.seeded_randomize(&rand::random());
            ctx
        },
        signatures: 0,
    });
}

/// A secp256k1 secret key used for signing. Erased on drop; never printed.
pub struct SigningKey {
    sk: secp256k1::SecretKey,
}

impl SigningKey {
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<SigningKey, CryptoError> {
        let sk = secp256k1::SecretKey::from_secret_bytes(*bytes).map_err(|_| CryptoError::MalformedSecretKey)?;
        Ok(SigningKey { sk })
    }

    pub(crate) fn from_secret(sk: secp256k1::SecretKey) -> SigningKey {
        SigningKey { sk }
    }

    /// The raw secret, for handing this key to an attested party over a secure channel
    /// (the FaaS leader's key delivery). Erased when the returned buffer is dropped.
    pub fn expose_secret_bytes(&self) -> zeroize::Zeroizing<[u8; 32]> {
        zeroize::Zeroizing::new(self.sk.to_secret_bytes())
    }

    /// Signs a 32-byte digest (RFC 6979 deterministic nonce, low-s), with this thread's own
    /// blinded context (see `SIGNER`).
    pub fn sign(&self, digest: &Hash256) -> Signature {
        use secp256k1::ffi::{self, CPtr};
        SIGNER.with(|cell| {
            let mut signer = cell.borrow_mut();
            if signer.signatures >= REBLIND_EVERY {
                signer.ctx.seeded_randomize(&rand::random());
                signer.signatures = 0;
            }
            signer.signatures += 1;
            // SAFETY: `ffi::Signature::new` is the zeroed out-value the C function writes;
            // it is passed only as the out-pointer below. `secp256k1_ecdsa_sign` reads a
            // context, a 32-byte message and a 32-byte secret key and writes one signature:
            // the context pointer comes from a live `Secp256k1<SignOnly>` (a signing-capable
            // context, owned by this thread and borrowed mutably-exclusively for the call, so
            // no other call uses or re-randomizes it meanwhile); `digest.0` is a `[u8; 32]`;
            // `self.sk.as_c_ptr()` points at the 32 bytes of a `SecretKey`, valid because it
            // was checked at construction; `ret` is a live, properly aligned `ffi::Signature`;
            // the nonce function is libsecp256k1's own RFC 6979 one with no extra data (a null
            // pointer, which it accepts). Nothing is kept past the call.
            let (ok, ret) = unsafe {
                let mut ret = ffi::Signature::new();
                let ok = ffi::secp256k1_ecdsa_sign(
                    signer.ctx.ctx().as_ptr(),
                    &mut ret,
                    digest.0.as_ptr(),
                    self.sk.as_c_ptr(),
                    ffi::secp256k1_nonce_function_rfc6979,
                    std::ptr::null(),
                );
                (ok, ret)
            };
            if ok == 1 {
                Signature(secp256k1::ecdsa::Signature::from(ret).serialize_compact())
            } else {
                // Cannot happen for a valid secret key (RFC 6979 always finds a nonce); the
                // library's own path then, rather than a panic.
                let msg = secp256k1::Message::from_digest(digest.0);
                Signature(secp256k1::ecdsa::sign(msg, &self.sk).serialize_compact())
            }
        })
    }

    pub fn verifying_key(&self) -> VerifyingKey {
        VerifyingKey { pk: self.sk.public_key() }
    }
}

impl Drop for SigningKey {
    fn drop(&mut self) {
        // libsecp256k1's SecretKey is a plain byte array; this overwrites it in place.
        self.sk.non_secure_erase();
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey(pub={})", self.verifying_key())
    }
}

/// A secp256k1 public key (compressed, 33 bytes on the wire).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct VerifyingKey {
    pub(crate) pk: secp256k1::PublicKey,
}

impl VerifyingKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<VerifyingKey, CryptoError> {
        if bytes.len() != PUBLIC_KEY_LEN {
            return Err(CryptoError::MalformedPublicKey);
        }
        let pk = secp256k1::PublicKey::from_slice(bytes).map_err(|_| CryptoError::MalformedPublicKey)?;
        Ok(VerifyingKey { pk })
    }

    pub fn to_bytes(&self) -> [u8; PUBLIC_KEY_LEN] {
        self.pk.serialize()
    }

    /// Verifies a compact signature over a 32-byte digest. High-s signatures are refused.
    pub fn verify(&self, digest: &Hash256, sig: &Signature) -> Result<(), CryptoError> {
        let s = secp256k1::ecdsa::Signature::from_compact(&sig.0).map_err(|_| CryptoError::MalformedSignature)?;
        let msg = secp256k1::Message::from_digest(digest.0);
        // libsecp256k1's verify rejects non-normalized (high-s) signatures.
        secp256k1::ecdsa::verify(&s, msg, &self.pk).map_err(|_| CryptoError::BadSignature)
    }
}

impl fmt::Display for VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.to_bytes()))
    }
}

impl fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VerifyingKey({})", &hex::encode(self.to_bytes())[..12])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sha256;

    #[test]
    fn sign_verify_and_reject() {
        let k = SigningKey::from_bytes(&[7u8; 32]).unwrap();
        let h = sha256(&[b"hello"]);
        let sig = k.sign(&h);
        let vk = k.verifying_key();
        assert_eq!(vk.verify(&h, &sig), Ok(()));
        assert_eq!(vk.verify(&sha256(&[b"other"]), &sig), Err(CryptoError::BadSignature));
        let other = SigningKey::from_bytes(&[8u8; 32]).unwrap().verifying_key();
        assert_eq!(other.verify(&h, &sig), Err(CryptoError::BadSignature));
        assert_eq!(VerifyingKey::from_bytes(&vk.to_bytes()).unwrap(), vk);
    }

    #[test]
    fn signatures_stay_deterministic_and_valid_across_reblinding() {
        // RFC 6979: the same key and digest give the same signature whatever the blinding,
        // before and after the thread's context is re-blinded, and as the library's own path.
        let k = SigningKey::from_bytes(&[11u8; 32]).unwrap();
        let vk = k.verifying_key();
        let h = sha256(&[b"record"]);
        let first = k.sign(&h);
        let lib = secp256k1::ecdsa::sign(secp256k1::Message::from_digest(h.0), &k.sk).serialize_compact();
        assert_eq!(first.0, lib);
        for i in 0..(3 * REBLIND_EVERY) {
            let d = sha256(&[b"record", &i.to_le_bytes()]);
            assert_eq!(vk.verify(&d, &k.sign(&d)), Ok(()));
            assert_eq!(k.sign(&h), first);
        }
    }

    #[test]
    fn high_s_is_refused() {
        let k = SigningKey::from_bytes(&[9u8; 32]).unwrap();
        let h = sha256(&[b"m"]);
        let sig = k.sign(&h);
        // Negate s: n - s. The curve order n:
        let n: [u8; 32] = hex_literal("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141");
        let mut s = [0u8; 32];
        s.copy_from_slice(&sig.0[32..]);
        let mut neg = [0u8; 32];
        let mut borrow = 0i16;
        for i in (0..32).rev() {
            let v = n[i] as i16 - s[i] as i16 - borrow;
            neg[i] = v.rem_euclid(256) as u8;
            borrow = if v < 0 { 1 } else { 0 };
        }
        let mut high = sig.0;
        high[32..].copy_from_slice(&neg);
        assert!(k.verifying_key().verify(&h, &Signature(high)).is_err());
    }

    fn hex_literal(s: &str) -> [u8; 32] {
        let mut o = [0u8; 32];
        hex::decode_to_slice(s, &mut o).unwrap();
        o
    }

    #[test]
    fn debug_never_shows_secret() {
        let k = SigningKey::from_bytes(&[0x42u8; 32]).unwrap();
        let s = format!("{k:?}");
        assert!(!s.contains("4242"), "{s}");
    }
}
