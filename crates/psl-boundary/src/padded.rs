//! [`CachePadded`]: keeps a value alone in its own pair of cache lines.

use std::ops::Deref;

/// A value aligned to, and padded out to, 128 bytes.
///
/// 128 rather than 64 because Intel's adjacent-line prefetcher fetches 64-byte lines in pairs,
/// so two hot values 64 bytes apart still ping-pong between cores. Data written by one side of
/// a ring (the consumer's position, the producer's counters) each get one of these, so a write
/// by one thread never invalidates a line the other thread is polling.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> Deref for CachePadded<T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::CachePadded;

    #[test]
    fn padded_to_two_lines() {
        assert_eq!(std::mem::align_of::<CachePadded<u8>>(), 128);
        assert_eq!(std::mem::size_of::<CachePadded<u64>>(), 128);
        let pair = [CachePadded(1u64), CachePadded(2u64)];
        let a = &pair[0] as *const _ as usize;
        let b = &pair[1] as *const _ as usize;
        assert_eq!(b - a, 128);
        assert_eq!(*pair[1], 2);
    }
}
