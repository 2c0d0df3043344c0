//! Record body sealing: AES-256-GCM under a key used for exactly one record.
//!
//! `record_key = HKDF-SHA256(ikm = data key, salt = 16 random bytes from the record header,
//!                           info = "psl/record-key/v1" || context)`
//!
//! where `context` names the record (capsule, writer, seq). Each record therefore has its own
//! AES key, and the GCM nonce can be the constant zero: a (key, nonce) pair repeats only if two
//! records draw the same 128-bit salt *and* the same context, which a writer that crashes and
//! re-issues a seq cannot cause by accident (probability 2^-128 per pair).

use crate::secret::Secret32;
use crate::{sha256, CryptoError, Hash256};
use aws_lc_rs::{aead, hkdf};
use std::fmt;
use zeroize::Zeroizing;

/// Bytes of the fresh random salt each sealed body starts with (the HKDF salt of its key).
pub const SALT_LEN: usize = 16;
/// Bytes of the AES-GCM authentication tag each sealed body ends with.
pub const TAG_LEN: usize = 16;

/// The symmetric application data key. Secret: not `Copy` (a [`Clone`] is a deliberate second
/// copy, in its own buffer); the 32 bytes stay in one heap allocation (`Secret32`) for the
/// key's whole life and are zeroed on drop; never printed.
#[derive(Clone)]
pub struct DataKey {
    key: Secret32,
}

// No `Drop` of its own: the `Secret32` zeroes the key when it is dropped.
impl zeroize::ZeroizeOnDrop for DataKey {}

struct Len(usize);
impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl DataKey {
    /// Copies `bytes` into the key's own buffer (by reference: an array passed by value would
    /// leave one more copy in the caller).
    pub fn from_bytes(bytes: &[u8; 32]) -> DataKey {
        DataKey { key: Secret32::copy_of(bytes) }
    }

    /// The raw key, for handing it to an attested party over a secure channel.
    pub fn expose_bytes(&self) -> &[u8; 32] {
        self.key.bytes()
    }

    pub(crate) fn derive_from(ikm: &[u8], label: &[u8]) -> DataKey {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, label).extract(ikm);
        let mut key = Secret32::zero();
        prk.expand(&[label], Len(32))
            .and_then(|okm| okm.fill(&mut key.bytes_mut()[..]))
            .expect("HKDF-SHA256 can always produce 32 bytes");
        DataKey { key }
    }

    /// A public name for this key (a one-way hash of it), so holders can check they agree.
    pub fn fingerprint(&self) -> Hash256 {
        sha256(&[b"psl/data-key-fp/v1", &self.key.bytes()[..]])
    }

    fn record_key(&self, salt: &[u8; SALT_LEN], context: &[u8]) -> aead::LessSafeKey {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(&self.key.bytes()[..]);
        let info: [&[u8]; 2] = [b"psl/record-key/v1", context];
        // Expanded into a buffer of our own, erased on return: aws-lc-rs's `UnboundKey::from(Okm)`
        // would stage the record key in a stack array it does not wipe. (aws-lc keeps its AES
        // key schedule on the heap and cleanses it when the key is freed.)
        let mut record_key = Zeroizing::new([0u8; 32]);
        prk.expand(&info, Len(32))
            .and_then(|okm| okm.fill(&mut record_key[..]))
            .expect("HKDF-SHA256 can always produce an AES-256 key");
        aead::LessSafeKey::new(
            aead::UnboundKey::new(&aead::AES_256_GCM, &record_key[..]).expect("32 bytes are an AES-256 key"),
        )
    }

    /// Seals `plaintext`, binding `aad`; returns ciphertext followed by the 16-byte tag.
    pub fn seal(&self, salt: &[u8; SALT_LEN], context: &[u8], aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let key = self.record_key(salt, context);
        let mut buf = Vec::with_capacity(plaintext.len() + TAG_LEN);
        buf.extend_from_slice(plaintext);
        key.seal_in_place_append_tag(aead::Nonce::assume_unique_for_key([0; 12]), aead::Aad::from(aad), &mut buf)
            .expect("AES-GCM sealing cannot fail for inputs under 64 GiB");
        buf
    }

    /// Like [`DataKey::seal`], in place: `buf` holds the plaintext and ends up holding the
    /// ciphertext followed by the tag. No copy of the plaintext is made, and none is left
    /// behind: the buffer is encrypted before the tag is appended (which may move it).
    pub fn seal_in_place(&self, salt: &[u8; SALT_LEN], context: &[u8], aad: &[u8], buf: &mut Vec<u8>) {
        let key = self.record_key(salt, context);
        let tag = key
            .seal_in_place_separate_tag(aead::Nonce::assume_unique_for_key([0; 12]), aead::Aad::from(aad), &mut buf[..])
            .expect("AES-GCM sealing cannot fail for inputs under 64 GiB");
        buf.extend_from_slice(tag.as_ref());
    }

    /// Opens what [`DataKey::seal`] produced. Any change to key, salt, context, aad or
    /// ciphertext fails with [`CryptoError::Decryption`].
    pub fn open(
        &self,
        salt: &[u8; SALT_LEN],
        context: &[u8],
        aad: &[u8],
        ciphertext: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
        if ciphertext.len() < TAG_LEN {
            return Err(CryptoError::Decryption);
        }
        let key = self.record_key(salt, context);
        let mut buf = Zeroizing::new(ciphertext.to_vec());
        let n = key
            .open_in_place(aead::Nonce::assume_unique_for_key([0; 12]), aead::Aad::from(aad), &mut buf)
            .map_err(|_| CryptoError::Decryption)?
            .len();
        buf.truncate(n);
        Ok(buf)
    }
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DataKey(fp={})", self.fingerprint().short())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_binding() {
        let k = DataKey::from_bytes(&[5; 32]);
        let salt = [1u8; SALT_LEN];
        let ct = k.seal(&salt, b"ctx", b"aad", b"hello world");
        assert_eq!(ct.len(), 11 + TAG_LEN);
        assert_eq!(&k.open(&salt, b"ctx", b"aad", &ct).unwrap()[..], b"hello world");
        assert!(k.open(&[2u8; SALT_LEN], b"ctx", b"aad", &ct).is_err());
        assert!(k.open(&salt, b"ctX", b"aad", &ct).is_err());
        assert!(k.open(&salt, b"ctx", b"aaD", &ct).is_err());
        assert!(DataKey::from_bytes(&[6; 32]).open(&salt, b"ctx", b"aad", &ct).is_err());
        let mut bad = ct.clone();
        bad[0] ^= 1;
        assert!(k.open(&salt, b"ctx", b"aad", &bad).is_err());
        assert!(k.open(&salt, b"ctx", b"aad", &ct[..5]).is_err());
    }

    #[test]
    fn seal_in_place_equals_seal() {
        let k = DataKey::from_bytes(&[5; 32]);
        let salt = [3u8; SALT_LEN];
        let mut buf = b"hello world".to_vec();
        k.seal_in_place(&salt, b"ctx", b"aad", &mut buf);
        assert_eq!(buf, k.seal(&salt, b"ctx", b"aad", b"hello world"));
        assert_eq!(&k.open(&salt, b"ctx", b"aad", &buf).unwrap()[..], b"hello world");
    }

    #[test]
    fn salts_give_distinct_ciphertexts() {
        let k = DataKey::from_bytes(&[5; 32]);
        let a = k.seal(&[1; SALT_LEN], b"c", b"", b"same");
        let b = k.seal(&[2; SALT_LEN], b"c", b"", b"same");
        assert_ne!(a, b);
    }

    #[test]
    fn debug_hides_key() {
        let k = DataKey::from_bytes(&[0xAB; 32]);
        let d = format!("{k:?}");
        assert!(!d.contains("abab") && !d.contains("171, 171"), "{d}");
    }

    #[test]
    fn key_stays_in_place_clones_are_separate_and_erase_clears() {
        use zeroize::Zeroize;
        let k = DataKey::from_bytes(&[9; 32]);
        let at = k.expose_bytes().as_ptr();
        let mut moved = Box::new(vec![k]);
        assert_eq!(moved[0].expose_bytes().as_ptr(), at, "a move must not copy the key");
        let c = moved[0].clone();
        assert_ne!(c.expose_bytes().as_ptr(), at);
        assert_eq!(c.fingerprint(), moved[0].fingerprint());
        // What dropping the key does, read while the key is alive.
        moved[0].key.zeroize();
        assert_eq!(moved[0].expose_bytes(), &[0u8; 32]);
        assert_eq!(c.expose_bytes(), &[9; 32], "erasing one copy leaves the deliberate clone");
    }

    #[test]
    fn record_key_matches_the_okm_conversion() {
        // The record key built from our own buffer is the one aws-lc-rs's `From<Okm>` builds.
        let k = DataKey::from_bytes(&[5; 32]);
        let salt = [4u8; SALT_LEN];
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(&k.expose_bytes()[..]);
        let info: [&[u8]; 2] = [b"psl/record-key/v1", b"ctx"];
        let lib = aead::LessSafeKey::new(aead::UnboundKey::from(prk.expand(&info, &aead::AES_256_GCM).unwrap()));
        let mut buf = b"payload".to_vec();
        lib.seal_in_place_append_tag(aead::Nonce::assume_unique_for_key([0; 12]), aead::Aad::from(b"aad"), &mut buf)
            .unwrap();
        assert_eq!(buf, k.seal(&salt, b"ctx", b"aad", b"payload"));
    }
}
