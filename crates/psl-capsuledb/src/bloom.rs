//! A Bloom filter: `k` probes `h1 + i * h2 (mod m)` from two seeded 64-bit hashes.

/// Bits per entry and probes used for new filters (about 1% false positives).
pub const BITS_PER_ENTRY: usize = 10;
/// Probes (hash functions) used for new filters.
pub const PROBES: u8 = 7;
/// Largest filter accepted by the decoder, in bytes.
pub const BLOOM_BYTES_MAX: usize = 1 << 20;
/// Most probes accepted by the decoder.
pub const PROBES_MAX: u8 = 16;

/// The two hashes of a key every filter's probes derive from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash(u64, u64);

impl KeyHash {
    /// The two hashes of `key`.
    pub fn of(key: &[u8]) -> KeyHash {
        KeyHash(hash64(key, 0x5053_4c42), hash64(key, 0x626c_6f6f) | 1)
    }
}

/// A Bloom filter over a block's keys: `k` probes into a bit array (at most
/// [`BLOOM_BYTES_MAX`] bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bloom {
    pub(crate) k: u8,
    pub(crate) bits: Vec<u8>,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded 64-bit hash of `data` (splitmix-style mixing of 8-byte words).
pub fn hash64(data: &[u8], seed: u64) -> u64 {
    let mut h = mix(seed ^ (data.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = mix(h ^ u64::from_le_bytes(w)).rotate_left(17);
    }
    let rest = chunks.remainder();
    let mut w = [0u8; 8];
    w[..rest.len()].copy_from_slice(rest);
    mix(h ^ u64::from_le_bytes(w) ^ 0xff)
}

impl Bloom {
    /// A filter sized for `n` keys, holding `keys`.
    pub fn build<'a>(n: usize, keys: impl IntoIterator<Item = &'a [u8]>) -> Bloom {
        let bytes = (n.saturating_mul(BITS_PER_ENTRY).div_ceil(8)).clamp(8, BLOOM_BYTES_MAX);
        let mut b = Bloom { k: PROBES, bits: vec![0; bytes] };
        for k in keys {
            b.insert(k);
        }
        b
    }

    /// Rebuilds a decoded filter; `None` if its shape is out of bounds.
    pub fn from_parts(k: u8, bits: Vec<u8>) -> Option<Bloom> {
        ((1..=PROBES_MAX).contains(&k) && !bits.is_empty() && bits.len() <= BLOOM_BYTES_MAX)
            .then_some(Bloom { k, bits })
    }

    fn probes(&self, h: KeyHash) -> impl Iterator<Item = usize> {
        let m = (self.bits.len() * 8) as u64;
        (0..self.k as u64).map(move |i| (h.0.wrapping_add(i.wrapping_mul(h.1)) % m) as usize)
    }

    /// Sets the bits of `key`'s probes.
    pub fn insert(&mut self, key: &[u8]) {
        let idx: Vec<usize> = self.probes(KeyHash::of(key)).collect();
        for i in idx {
            self.bits[i / 8] |= 1 << (i % 8);
        }
    }

    /// `false` means the key is certainly absent.
    pub fn may_contain(&self, key: &[u8]) -> bool {
        self.may_contain_hashed(KeyHash::of(key))
    }

    /// [`Bloom::may_contain`] with the key's hashes computed once (a read asks many filters).
    pub fn may_contain_hashed(&self, h: KeyHash) -> bool {
        self.probes(h).all(|i| self.bits[i / 8] & (1 << (i % 8)) != 0)
    }
}
