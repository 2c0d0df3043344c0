//! Cryptographic building blocks of PSL. Nothing here knows about records or capsules.
//!
//! Module map:
//! - [`hash`]: SHA-256 digests ([`Hash256`]) with domain separation.
//! - [`sign`]: ECDSA on secp256k1 ([`SigningKey`], [`VerifyingKey`], [`Signature`]), canonical low-s.
//! - [`hierarchy`]: the BIP32 key tree: owner master → hardened application key → non-hardened
//!   writer keys ([`OwnerKey`], [`AppKey`], [`AppPublicKey`]), and the owner key file.
//! - [`aead`]: AES-256-GCM sealing with a fresh HKDF-derived key per record ([`DataKey`]).
//!
//! Secrets ([`SigningKey`], [`OwnerKey`], [`AppKey`], [`DataKey`]) are not `Copy`: each keeps
//! its bytes in one heap buffer of its own (`secret::Secret32`) that moves with it without being
//! copied and is zeroed when dropped, and none implements `Debug`/`Display` with its contents.
//! The checks below hold at compile time; these do not compile:
//!
//! ```compile_fail
//! fn copy<T: Copy>() {}
//! copy::<psl_crypto::SigningKey>();
//! ```
//! ```compile_fail
//! fn copy<T: Copy>() {}
//! copy::<psl_crypto::DataKey>();
//! ```
//! ```compile_fail
//! fn copy<T: Copy>() {}
//! copy::<psl_crypto::OwnerKey>();
//! ```
//! ```compile_fail
//! fn copy<T: Copy>() {}
//! copy::<psl_crypto::AppKey>();
//! ```
//! ```compile_fail
//! fn clone<T: Clone>() {}
//! clone::<psl_crypto::SigningKey>();
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod aead;
pub mod hash;
pub mod hierarchy;
mod secret;
pub mod sign;

/// Fails to compile if `$t` implements `$tr` (two impls of `Ambiguous` then apply, and the
/// call cannot pick one): the trick of the `static_assertions` crate, without the crate.
macro_rules! assert_not_impl {
    ($t:ty, $tr:path) => {
        const _: fn() = || {
            trait Ambiguous<A> {
                fn some_item() {}
            }
            impl<T: ?Sized> Ambiguous<()> for T {}
            impl<T: ?Sized + $tr> Ambiguous<u8> for T {}
            let _ = <$t as Ambiguous<_>>::some_item;
        };
    };
}

// No secret is `Copy` (a copy would outlive the original's erasure); the signing and tree keys
// are not even `Clone` (a copy goes through `expose_secret_bytes`, deliberately); each zeroes its
// bytes on drop.
assert_not_impl!(SigningKey, Copy);
assert_not_impl!(OwnerKey, Copy);
assert_not_impl!(AppKey, Copy);
assert_not_impl!(DataKey, Copy);
assert_not_impl!(secret::Secret32, Copy);
assert_not_impl!(SigningKey, Clone);
assert_not_impl!(OwnerKey, Clone);
assert_not_impl!(AppKey, Clone);
const _: fn() = || {
    fn zeroized_on_drop<T: zeroize::ZeroizeOnDrop>() {}
    zeroized_on_drop::<SigningKey>();
    zeroized_on_drop::<OwnerKey>();
    zeroized_on_drop::<AppKey>();
    zeroized_on_drop::<DataKey>();
    zeroized_on_drop::<secret::Secret32>();
};

pub use aead::{DataKey, SALT_LEN, TAG_LEN};
pub use hash::{sha256, Hash256};
pub use hierarchy::{AppKey, AppPublicKey, OwnerKey, OwnerPublicKey, WRITER_INDEX_MAX};
pub use sign::{Signature, SigningKey, VerifyingKey, PUBLIC_KEY_LEN, SIGNATURE_LEN};

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CryptoError {
    /// A well-formed signature that the expected public key does not verify.
    #[error("signature does not verify under the expected public key")]
    BadSignature,
    /// Signature bytes that are not a canonical (low-s) ECDSA signature.
    #[error("signature bytes are not a valid canonical (low-s) ECDSA signature")]
    MalformedSignature,
    /// Public key bytes that are not a compressed secp256k1 point.
    #[error("public key bytes are not a valid compressed secp256k1 point")]
    MalformedPublicKey,
    /// Secret key bytes that are not a valid secp256k1 scalar (zero, or not below the order).
    #[error("secret key bytes are not a valid secp256k1 scalar")]
    MalformedSecretKey,
    /// A BIP32 derivation that failed: an out-of-range index or master seed, or an invalid
    /// child key (probability about 2^-127).
    #[error("key derivation failed at child index {index}: {why}")]
    Derivation {
        /// The child index asked for.
        index: u32,
        /// Why it failed.
        why: &'static str,
    },
    /// A writer index above [`WRITER_INDEX_MAX`] (a hardened index).
    #[error("writer index {0} is out of range (non-hardened indices are below 2^31)")]
    WriterIndex(u32),
    /// AES-GCM refused the ciphertext: a wrong key, or altered bytes or associated data.
    #[error("authenticated decryption failed (wrong key, or the ciphertext or its header was altered)")]
    Decryption,
    /// An owner key file or seed that does not parse; the text says what is wrong.
    #[error("key file: {0}")]
    KeyFile(String),
}
