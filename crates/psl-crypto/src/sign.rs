//! ECDSA over secp256k1 (libsecp256k1). Signatures are 64-byte compact `r || s` with low `s`:
//! the verifier refuses the `s -> n - s` twin, so nobody but the key holder can make a second
//! valid signature of a record. (Record hashes do not cover the signature in any case.)

use crate::secret::Secret32;
use crate::{CryptoError, Hash256};
use secp256k1::ffi;
use std::fmt;

/// Bytes of a compact ECDSA signature (r ‖ s, low-s).
pub const SIGNATURE_LEN: usize = 64;
/// Bytes of a compressed secp256k1 public key.
pub const PUBLIC_KEY_LEN: usize = 33;

/// A 64-byte compact ECDSA signature as it travels on the wire. Not checked until verified.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature(pub [u8; SIGNATURE_LEN]);

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({}…)", hex::encode(&self.0[..6]))
    }
}

/// Uses of a thread's signing context (signatures, public keys) between two re-blindings.
const REBLIND_EVERY: u32 = 64;

/// A thread's libsecp256k1 signing context. libsecp256k1 blinds its fixed-base multiplication
/// (`k * G`, the secret-dependent part of signing) with a random value held in the context,
/// against side channels beyond timing, which its constant-time code already closes. The
/// `secp256k1` crate's `ecdsa::sign` uses a global context that it re-blinds after *every*
/// signature, which costs about as much as the signature itself; writers and CapsuleDB sign
/// one record after another, so here each thread keeps its own context, blinded with fresh
/// randomness when created and again every [`REBLIND_EVERY`] uses.
struct Signer {
    ctx: secp256k1::Secp256k1<secp256k1::SignOnly>,
    uses: u32,
}

thread_local! {
    static SIGNER: std::cell::RefCell<Signer> = std::cell::RefCell::new(Signer {
        ctx: {
            let mut ctx = secp256k1::Secp256k1::signing_only();
            ctx.seeded_randomize(&rand::random());
            ctx
        },
        uses: 0,
    });
}

/// Runs `f` with this thread's signing context, re-blinded first when due. The context stays
/// borrowed mutably (exclusively) until `f` returns, so nothing else uses or re-randomizes it
/// meanwhile. `f` must not call back into `with_signer` (the borrow would panic).
fn with_signer<R>(f: impl FnOnce(*const ffi::Context) -> R) -> R {
    SIGNER.with(|cell| {
        let mut signer = cell.borrow_mut();
        if signer.uses >= REBLIND_EVERY {
            signer.ctx.seeded_randomize(&rand::random());
            signer.uses = 0;
        }
        signer.uses += 1;
        f(signer.ctx.ctx().as_ptr())
    })
}

/// Whether `secret` is a valid secp256k1 secret key: a non-zero scalar below the curve order.
pub(crate) fn secret_is_valid(secret: &[u8; 32]) -> bool {
    with_signer(|ctx| {
        // SAFETY: `secp256k1_ec_seckey_verify` reads a context and 32 bytes and writes nothing:
        // `ctx` points at this thread's live signing context (see `with_signer`), and
        // `secret.as_ptr()` at the 32 bytes of a `&[u8; 32]`. Nothing is kept past the call.
        unsafe { ffi::secp256k1_ec_seckey_verify(ctx, secret.as_ptr()) == 1 }
    })
}

/// The public key of `secret`, computed from the bytes where they are (no `SecretKey` copy).
pub(crate) fn public_key_of(secret: &[u8; 32]) -> Result<secp256k1::PublicKey, CryptoError> {
    with_signer(|ctx| {
        // SAFETY: `ffi::PublicKey::new` is the zeroed out-value the C function writes; it is
        // passed only as the out-pointer below and read only if the call succeeded.
        // `secp256k1_ec_pubkey_create` reads a signing-capable context and 32 secret bytes and
        // writes one public key: `ctx` points at this thread's live `Secp256k1<SignOnly>`,
        // borrowed exclusively for the call (see `with_signer`); `secret.as_ptr()` points at the
        // 32 bytes of a `&[u8; 32]` (an invalid scalar makes it return 0, not misbehave); `pk` is
        // a live, properly aligned `ffi::PublicKey`. Nothing is kept past the call.
        let (ok, pk) = unsafe {
            let mut pk = ffi::PublicKey::new();
            let ok = ffi::secp256k1_ec_pubkey_create(ctx, &mut pk, secret.as_ptr());
            (ok, pk)
        };
        if ok == 1 {
            Ok(secp256k1::PublicKey::from(pk))
        } else {
            Err(CryptoError::MalformedSecretKey)
        }
    })
}

/// `secret = secret + tweak mod n` in place (BIP32 CKDpriv). False, leaving `secret` unspecified,
/// when `tweak` is not below the curve order or the sum is zero.
pub(crate) fn tweak_add_in_place(secret: &mut [u8; 32], tweak: &[u8; 32]) -> bool {
    with_signer(|ctx| {
        // SAFETY: `secp256k1_ec_seckey_tweak_add` reads a context and a 32-byte tweak and
        // reads and writes 32 secret bytes: `ctx` points at this thread's live signing context
        // (see `with_signer`); `secret.as_mut_ptr()` points at the 32 bytes of a `&mut [u8; 32]`,
        // exclusively borrowed for the call; `tweak.as_ptr()` at the 32 bytes of a `&[u8; 32]`
        // (a different array: `secret` is borrowed mutably, so they cannot overlap). Invalid
        // inputs make it return 0. Nothing is kept past the call.
        unsafe { ffi::secp256k1_ec_seckey_tweak_add(ctx, secret.as_mut_ptr(), tweak.as_ptr()) == 1 }
    })
}

/// A secp256k1 secret key used for signing. Not `Copy` nor `Clone`: the 32-byte scalar stays in
/// one heap allocation (`Secret32`) for the key's whole life, so moving the key moves a
/// pointer, and it is zeroed when the key is dropped. Never printed.
pub struct SigningKey {
    secret: Secret32,
}

impl SigningKey {
    /// A signing key from its 32 secret bytes; refuses zero and values not below the curve order.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<SigningKey, CryptoError> {
        SigningKey::from_secret(Secret32::copy_of(bytes))
    }

    /// A new key from OS randomness, drawn straight into the key's own buffer.
    pub fn generate() -> SigningKey {
        loop {
            if let Ok(k) = SigningKey::from_secret(Secret32::random()) {
                return k;
            }
        }
    }

    pub(crate) fn from_secret(secret: Secret32) -> Result<SigningKey, CryptoError> {
        if secret_is_valid(secret.bytes()) {
            Ok(SigningKey { secret })
        } else {
            Err(CryptoError::MalformedSecretKey)
        }
    }

    /// The raw secret, for handing this key to an attested party over a secure channel
    /// (the FaaS leader's key delivery). Erased when the returned buffer is dropped.
    pub fn expose_secret_bytes(&self) -> zeroize::Zeroizing<[u8; 32]> {
        zeroize::Zeroizing::new(*self.secret.bytes())
    }

    /// Signs a 32-byte digest (RFC 6979 deterministic nonce, low-s), with this thread's own
    /// blinded context (see `SIGNER`).
    pub fn sign(&self, digest: &Hash256) -> Signature {
        let secret = self.secret.bytes();
        let (ok, ret) = with_signer(|ctx| {
            // SAFETY: `ffi::Signature::new` is the zeroed out-value the C function writes;
            // it is passed only as the out-pointer below. `secp256k1_ecdsa_sign` reads a
            // context, a 32-byte message and a 32-byte secret key and writes one signature:
            // `ctx` points at a live `Secp256k1<SignOnly>` (a signing-capable context, owned by
            // this thread and borrowed mutably-exclusively for the call, so no other call uses
            // or re-randomizes it meanwhile; see `with_signer`); `digest.0` is a `[u8; 32]`;
            // `secret.as_ptr()` points at the 32 bytes of this key's `Secret32`, a valid scalar
            // (checked at construction), borrowed for the call; `ret` is a live, properly
            // aligned `ffi::Signature`; the nonce function is libsecp256k1's own RFC 6979 one
            // with no extra data (a null pointer, which it accepts). Nothing is kept past the
            // call.
            unsafe {
                let mut ret = ffi::Signature::new();
                let ok = ffi::secp256k1_ecdsa_sign(
                    ctx,
                    &mut ret,
                    digest.0.as_ptr(),
                    secret.as_ptr(),
                    ffi::secp256k1_nonce_function_rfc6979,
                    std::ptr::null(),
                );
                (ok, ret)
            }
        });
        if ok == 1 {
            Signature(secp256k1::ecdsa::Signature::from(ret).serialize_compact())
        } else {
            // Cannot happen for a valid secret key (RFC 6979 always finds a nonce); the
            // library's own path then, rather than a panic, its `SecretKey` copy erased after.
            let msg = secp256k1::Message::from_digest(digest.0);
            let mut sk = secp256k1::SecretKey::from_secret_bytes(*secret).expect("valid secret by construction");
            let sig = Signature(secp256k1::ecdsa::sign(msg, &sk).serialize_compact());
            sk.non_secure_erase();
            sig
        }
    }

    /// The public key that verifies this key's signatures.
    pub fn verifying_key(&self) -> VerifyingKey {
        VerifyingKey { pk: public_key_of(self.secret.bytes()).expect("valid secret by construction") }
    }
}

// No `Drop` of its own: the `Secret32` zeroes the scalar when the key is dropped.
impl zeroize::ZeroizeOnDrop for SigningKey {}

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
    /// Decodes a compressed point ([`PUBLIC_KEY_LEN`] bytes); refuses anything else.
    pub fn from_bytes(bytes: &[u8]) -> Result<VerifyingKey, CryptoError> {
        if bytes.len() != PUBLIC_KEY_LEN {
            return Err(CryptoError::MalformedPublicKey);
        }
        let pk = secp256k1::PublicKey::from_slice(bytes).map_err(|_| CryptoError::MalformedPublicKey)?;
        Ok(VerifyingKey { pk })
    }

    /// The compressed point.
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
        let sk = secp256k1::SecretKey::from_secret_bytes(*k.secret.bytes()).unwrap();
        let lib = secp256k1::ecdsa::sign(secp256k1::Message::from_digest(h.0), &sk).serialize_compact();
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

    /// Timing of `sign()`, not a check: `cargo test -p psl-crypto --lib sign_timing -- --ignored
    /// --nocapture` (psl-crypto and its dependencies build at opt-level 2 in test builds).
    #[test]
    #[ignore]
    fn sign_timing() {
        let k = SigningKey::from_bytes(&[0x5au8; 32]).unwrap();
        let digests: Vec<Hash256> = (0u32..1000).map(|i| sha256(&[&i.to_le_bytes()])).collect();
        let mut runs = Vec::new();
        for _ in 0..7 {
            let t = std::time::Instant::now();
            for _ in 0..10 {
                for d in &digests {
                    std::hint::black_box(k.sign(std::hint::black_box(d)));
                }
            }
            runs.push(t.elapsed().as_nanos() as f64 / 10_000.0);
        }
        runs.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("sign(): min {:.0} ns, median {:.0} ns, max {:.0} ns (7 runs of 10000)", runs[0], runs[3], runs[6]);
    }

    #[test]
    fn debug_never_shows_secret() {
        let k = SigningKey::from_bytes(&[0x42u8; 32]).unwrap();
        let s = format!("{k:?}");
        assert!(!s.contains("4242"), "{s}");
        let g = SigningKey::generate();
        let secret_hex = hex::encode(&g.expose_secret_bytes()[..]);
        let s = format!("{g:?}");
        assert!(!s.contains(&secret_hex[..8]), "{s}");
    }

    #[test]
    fn moving_a_key_leaves_its_scalar_in_place() {
        let k = SigningKey::from_bytes(&[0x42u8; 32]).unwrap();
        let at = k.secret.bytes().as_ptr();
        let keys = Box::new(vec![(1u32, k)]);
        assert_eq!(keys[0].1.secret.bytes().as_ptr(), at, "a move must not copy the scalar");
    }

    #[test]
    fn explicit_erase_clears_the_scalar() {
        use zeroize::Zeroize;
        let mut k = SigningKey::from_bytes(&[0x42u8; 32]).unwrap();
        assert_eq!(k.secret.bytes(), &[0x42; 32]);
        // What dropping the key does (read here while the key is alive, not after a free).
        k.secret.zeroize();
        assert_eq!(k.secret.bytes(), &[0u8; 32]);
    }

    #[test]
    fn invalid_scalars_refused_and_generated_keys_work() {
        assert_eq!(SigningKey::from_bytes(&[0u8; 32]).err(), Some(CryptoError::MalformedSecretKey));
        let n = hex_literal("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141");
        assert!(SigningKey::from_bytes(&n).is_err());
        let k = SigningKey::generate();
        let h = sha256(&[b"generated"]);
        assert_eq!(k.verifying_key().verify(&h, &k.sign(&h)), Ok(()));
        // The same public key as the library computes from the same scalar.
        let sk = secp256k1::SecretKey::from_secret_bytes(*k.expose_secret_bytes()).unwrap();
        assert_eq!(k.verifying_key().pk, sk.public_key());
        assert_eq!(SigningKey::from_bytes(&k.expose_secret_bytes()).unwrap().verifying_key(), k.verifying_key());
    }
}
