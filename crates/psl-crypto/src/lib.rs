//! Cryptographic building blocks of PSL. Nothing here knows about records or capsules.
//!
//! Module map:
//! - [`hash`]: SHA-256 digests ([`Hash256`]) with domain separation.
//! - [`sign`]: ECDSA on secp256k1 ([`SigningKey`], [`VerifyingKey`], [`Signature`]), canonical low-s.
//! - [`hierarchy`]: the BIP32 key tree: owner master → hardened application key → non-hardened
//!   writer keys ([`OwnerKey`], [`AppKey`], [`AppPublicKey`]), and the owner key file.
//! - [`aead`]: AES-256-GCM sealing with a fresh HKDF-derived key per record ([`DataKey`]).
//!
//! Secrets live in zeroizing buffers, are erased on drop and never implement `Debug`/`Display`
//! with their contents.

pub mod aead;
pub mod hash;
pub mod hierarchy;
pub mod sign;

pub use aead::{DataKey, SALT_LEN, TAG_LEN};
pub use hash::{sha256, Hash256};
pub use hierarchy::{AppKey, AppPublicKey, OwnerKey, OwnerPublicKey, WRITER_INDEX_MAX};
pub use sign::{Signature, SigningKey, VerifyingKey, PUBLIC_KEY_LEN, SIGNATURE_LEN};

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CryptoError {
    #[error("signature does not verify under the expected public key")]
    BadSignature,
    #[error("signature bytes are not a valid canonical (low-s) ECDSA signature")]
    MalformedSignature,
    #[error("public key bytes are not a valid compressed secp256k1 point")]
    MalformedPublicKey,
    #[error("secret key bytes are not a valid secp256k1 scalar")]
    MalformedSecretKey,
    #[error("key derivation failed at child index {index}: {why}")]
    Derivation { index: u32, why: &'static str },
    #[error("writer index {0} is out of range (non-hardened indices are below 2^31)")]
    WriterIndex(u32),
    #[error("authenticated decryption failed (wrong key, or the ciphertext or its header was altered)")]
    Decryption,
    #[error("key file: {0}")]
    KeyFile(String),
}
