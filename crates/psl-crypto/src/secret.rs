//! [`Secret32`]: 32 secret bytes at one heap address, erased when dropped.
//!
//! Every secret of this crate lives in one: signing scalars ([`crate::SigningKey`]), the scalar
//! and chain code of each extended private key of the key tree, the data key
//! ([`crate::DataKey`]). Moving the owner moves a pointer, never the bytes, so no stale copy is
//! left behind in a moved-from stack slot or struct; when the owner is dropped the bytes are
//! overwritten with zeros by `zeroize` (volatile writes and a compiler fence, which the optimizer
//! may not remove as dead stores) before the allocation is freed. libsecp256k1 is handed a
//! pointer to these bytes (see `sign.rs`) rather than a `secp256k1::SecretKey`, a `Copy` type of
//! which every move or copy would leave another copy of the scalar behind.
//!
//! What this cannot reach: copies the CPU or a library makes while computing with a secret
//! (registers, spilled stack, libsecp256k1's and aws-lc's own temporaries), and values a caller
//! asks for explicitly (`expose_secret_bytes`, `expose_bytes`), which are in the caller's care.

use std::fmt;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// 32 secret bytes in their own heap allocation, zeroed on drop. Not `Copy`; [`Clone`] makes a
/// deliberate second copy in a second allocation. `Debug` shows no byte of it.
pub(crate) struct Secret32(Box<Zeroizing<[u8; 32]>>);

impl Secret32 {
    /// All zeros, in a fresh allocation (the secret is then written in place).
    pub(crate) fn zero() -> Secret32 {
        Secret32(Box::new(Zeroizing::new([0u8; 32])))
    }

    /// A copy of `bytes`, written straight into the allocation.
    pub(crate) fn copy_of(bytes: &[u8; 32]) -> Secret32 {
        let mut s = Secret32::zero();
        s.bytes_mut().copy_from_slice(bytes);
        s
    }

    /// 32 bytes of OS randomness, drawn straight into the allocation.
    pub(crate) fn random() -> Secret32 {
        let mut s = Secret32::zero();
        rand::fill(&mut s.bytes_mut()[..]);
        s
    }

    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8; 32] {
        &mut self.0
    }
}

impl Clone for Secret32 {
    fn clone(&self) -> Secret32 {
        // Not `Box::clone`, which may stage the value on the stack: straight into the new box.
        Secret32::copy_of(self.bytes())
    }
}

impl Zeroize for Secret32 {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}

/// The inner `Zeroizing` zeroes the bytes when the box is dropped.
impl ZeroizeOnDrop for Secret32 {}

impl fmt::Debug for Secret32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret32(..)")
    }
}

/// Overwrites `place`, a `Copy` value a library hands back holding secret bytes (aws-lc-rs's
/// `hmac::Tag`, say, which `zeroize` has no impl for), with the public value `blank`, by a
/// volatile write the compiler may not elide, followed by a compiler fence (as `zeroize` does).
pub(crate) fn overwrite<T: Copy>(place: &mut T, blank: T) {
    // SAFETY: `place` is a `&mut T`, so the pointer is non-null, aligned, valid for writes of one
    // `T` and not aliased during the call; `blank` is a valid `T`. `T: Copy` has no destructor,
    // so replacing the old value without dropping it skips no cleanup and breaks no invariant.
    unsafe { std::ptr::write_volatile(place, blank) };
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_zeroize_clears_the_bytes() {
        let mut s = Secret32::copy_of(&[0x42; 32]);
        assert_eq!(s.bytes(), &[0x42; 32]);
        s.zeroize();
        // The same live allocation, read before it is freed.
        assert_eq!(s.bytes(), &[0u8; 32]);
    }

    #[test]
    fn moves_keep_the_bytes_at_one_address_and_clones_are_separate() {
        let s = Secret32::copy_of(&[7; 32]);
        let at = s.bytes().as_ptr();
        let moved = vec![s];
        let moved = Box::new(moved);
        assert_eq!(moved[0].bytes().as_ptr(), at, "a move must not copy the secret");
        let c = moved[0].clone();
        assert_ne!(c.bytes().as_ptr(), at);
        assert_eq!(c.bytes(), &[7; 32]);
    }

    #[test]
    fn overwrite_replaces_a_copy_value() {
        let mut tag = [0x42u8; 64];
        overwrite(&mut tag, [0u8; 64]);
        assert_eq!(tag, [0u8; 64]);
    }

    #[test]
    fn debug_shows_no_byte() {
        let s = Secret32::copy_of(&[0x42; 32]);
        let d = format!("{s:?}");
        assert!(!d.contains("42") && !d.contains("66"), "{d}");
    }
}
