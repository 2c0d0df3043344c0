//! [`InlineKey`]: a byte-string map key that keeps short keys inside the map's own slot.
//!
//! A `Box<[u8]>` key costs a lookup one more cache miss: the table slot holds only a pointer,
//! and confirming a hash match reads the key from the heap. With the key in the slot, the
//! comparison reads memory the lookup has just fetched. Keys of up to
//! [`INLINE_KEY_BYTES_MAX`] bytes (memcached keys are usually well under that) are stored
//! inline; longer ones fall back to the heap. The type is 40 bytes either way, and hashes,
//! compares and borrows exactly as the `[u8]` it holds, so maps keyed by it are looked up
//! with a plain `&[u8]`.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// Longest key kept inline (the rest of the 40 bytes are the length and the variant tag).
pub const INLINE_KEY_BYTES_MAX: usize = 38;

/// A byte string, inline up to [`INLINE_KEY_BYTES_MAX`] bytes, boxed beyond.
#[derive(Clone)]
pub enum InlineKey {
    /// A key of at most [`INLINE_KEY_BYTES_MAX`] bytes, stored in place.
    Inline {
        /// The key's length in bytes (at most [`INLINE_KEY_BYTES_MAX`]).
        len: u8,
        /// The key in its first `len` bytes, zeros after.
        buf: [u8; INLINE_KEY_BYTES_MAX],
    },
    /// A longer key, on the heap.
    Heap(Box<[u8]>),
}

impl InlineKey {
    /// The key's bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            // `len` is at most INLINE_KEY_BYTES_MAX by construction (`From<&[u8]>`); `get`
            // keeps even a wrong one from panicking.
            InlineKey::Inline { len, buf } => buf.get(..*len as usize).unwrap_or(buf),
            InlineKey::Heap(b) => b,
        }
    }
}

impl From<&[u8]> for InlineKey {
    fn from(k: &[u8]) -> InlineKey {
        if k.len() <= INLINE_KEY_BYTES_MAX {
            let mut buf = [0u8; INLINE_KEY_BYTES_MAX];
            buf[..k.len()].copy_from_slice(k);
            InlineKey::Inline { len: k.len() as u8, buf }
        } else {
            InlineKey::Heap(k.into())
        }
    }
}

impl Deref for InlineKey {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Borrow<[u8]> for InlineKey {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

/// Hashes as the `[u8]` it holds (required by `Borrow<[u8]>` lookups).
impl Hash for InlineKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state)
    }
}

impl PartialEq for InlineKey {
    fn eq(&self, other: &InlineKey) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for InlineKey {}

impl std::fmt::Debug for InlineKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::hash::BuildHasher;

    #[test]
    fn is_forty_bytes() {
        assert_eq!(std::mem::size_of::<InlineKey>(), 40);
    }

    proptest! {
        #[test]
        fn behaves_as_its_bytes(a in proptest::collection::vec(any::<u8>(), 0..80),
                                b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let (ka, kb) = (InlineKey::from(&a[..]), InlineKey::from(&b[..]));
            prop_assert_eq!(&*ka, &a[..]);
            prop_assert_eq!(matches!(ka, InlineKey::Inline { .. }), a.len() <= INLINE_KEY_BYTES_MAX);
            prop_assert_eq!(ka == kb, a == b);
            let s = rustc_hash::FxBuildHasher;
            prop_assert_eq!(s.hash_one(&ka), s.hash_one(&a[..]));
            let mut m = rustc_hash::FxHashMap::default();
            m.insert(ka.clone(), 1);
            prop_assert_eq!(m.get(&a[..]), Some(&1));
        }
    }
}
