//! YCSB's key choosers, as YCSB's `CoreWorkload` builds them (Cooper et al., "Benchmarking
//! cloud serving systems with YCSB", and the generators in YCSB's `site.ycsb.generator`):
//!
//! - [`Zipfian`]: Gray et al.'s generator ("Quickly generating billion-record synthetic
//!   databases"), with YCSB's incremental zeta when the item count grows (the basis of
//!   `latest`).
//! - [`ScrambledZipfian`]: YCSB's `ScrambledZipfianGenerator`: a zipfian over 10^10 items with
//!   YCSB's precomputed zeta, hashed with FNV-1a-64 onto the key space, so the popular keys are
//!   spread over it (and the skew over a small key space is what YCSB's is, not a zipfian over
//!   that key space).
//! - [`Latest`]: YCSB's `SkewedLatestGenerator`: the most recently inserted keys are the most
//!   popular (workload D), over the keys whose insert was acknowledged ([`AckWindow`]).
//! - uniform over the key space.
//!
//! Key names are YCSB's: `"user"` followed by the FNV-1a-64 hash of the key number in decimal
//! (`CoreWorkload.buildKeyName` with hashed inserts), at most 23 bytes.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// YCSB's zipfian constant (theta).
pub const ZIPFIAN_THETA: f64 = 0.99;
/// `ScrambledZipfianGenerator.ITEM_COUNT`.
const SCRAMBLED_ITEMS: u64 = 10_000_000_000;
/// `ScrambledZipfianGenerator.ZETAN`: zeta(10^10, 0.99), precomputed by YCSB.
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// YCSB's `Utils.fnvhash64` (FNV-1a over the 8 bytes of `v`, least significant first), with
/// Java's `Math.abs` as a cleared sign bit.
pub fn fnvhash64(mut v: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for _ in 0..8 {
        h ^= v & 0xff;
        v >>= 8;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h & (i64::MAX as u64)
}

/// Writes key number `k`'s name (`user<fnvhash64(k)>`) to `out`.
pub fn key_name(k: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b"user");
    push_u64(out, fnvhash64(k));
}

/// Appends `v` in decimal.
pub fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// A small fast generator (xoshiro256**), seeded through splitmix64. Not for keys or nonces:
/// it only draws workload choices.
#[derive(Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

fn zeta_range(from: u64, to: u64, theta: f64, start: f64) -> f64 {
    let mut sum = start;
    for i in from..to {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// YCSB's `ZipfianGenerator` over `0..items`: item 0 the most popular.
pub struct Zipfian {
    items: u64,
    theta: f64,
    zeta2: f64,
    zetan: f64,
    alpha: f64,
    eta: f64,
    /// The item count `zetan` was computed for.
    count_for_zeta: u64,
}

impl Zipfian {
    pub fn new(items: u64, theta: f64) -> Zipfian {
        let items = items.max(1);
        let zetan = zeta_range(0, items, theta, 0.0);
        Self::with_zetan(items, theta, zetan)
    }

    fn with_zetan(items: u64, theta: f64, zetan: f64) -> Zipfian {
        let zeta2 = zeta_range(0, 2, theta, 0.0);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipfian { items, theta, zeta2, zetan, alpha, eta, count_for_zeta: items }
    }

    /// The next item in `0..items` (YCSB's `nextLong(itemcount)`), after growing the item
    /// count to `items` if it is larger (zeta extended incrementally, as YCSB does; it never
    /// shrinks here).
    pub fn next_of(&mut self, rng: &mut Rng, items: u64) -> u64 {
        if items > self.count_for_zeta {
            self.zetan = zeta_range(self.count_for_zeta, items, self.theta, self.zetan);
            self.count_for_zeta = items;
            self.items = items;
            self.eta = (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan);
        }
        let n = self.items;
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(n - 1);
        }
        let r = (n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(n - 1)
    }

    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        let n = self.items;
        self.next_of(rng, n)
    }
}

/// YCSB's `ScrambledZipfianGenerator(0, items - 1)` with the default constant.
pub struct ScrambledZipfian {
    items: u64,
    gen: Zipfian,
}

impl ScrambledZipfian {
    pub fn new(items: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            items: items.max(1),
            gen: Zipfian::with_zetan(SCRAMBLED_ITEMS, ZIPFIAN_THETA, SCRAMBLED_ZETAN),
        }
    }

    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        fnvhash64(self.gen.next(rng)) % self.items
    }
}

/// The key numbers whose insert was acknowledged, as YCSB's `AcknowledgedCounterGenerator`:
/// [`AckWindow::limit`] is the first key number not known to be inserted with every key below
/// it. Inserts take numbers from [`AckWindow::allocate`] and report them done with
/// [`AckWindow::acknowledge`] in any order.
pub struct AckWindow {
    next: AtomicU64,
    limit: AtomicU64,
    pending: Mutex<BTreeSet<u64>>,
}

impl AckWindow {
    /// Key numbers `0..start` are inserted (the load phase).
    pub fn new(start: u64) -> AckWindow {
        AckWindow { next: AtomicU64::new(start), limit: AtomicU64::new(start), pending: Mutex::new(BTreeSet::new()) }
    }

    pub fn allocate(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    pub fn acknowledge(&self, k: u64) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.insert(k);
        let mut limit = self.limit.load(Ordering::Relaxed);
        while p.remove(&limit) {
            limit += 1;
        }
        self.limit.store(limit, Ordering::Release);
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Acquire)
    }
}

/// YCSB's `SkewedLatestGenerator`: `limit - 1 - zipfian(limit)`.
pub struct Latest {
    gen: Zipfian,
}

impl Latest {
    pub fn new(start: u64) -> Latest {
        Latest { gen: Zipfian::new(start.max(1), ZIPFIAN_THETA) }
    }

    pub fn next(&mut self, rng: &mut Rng, window: &AckWindow) -> u64 {
        let limit = window.limit().max(1);
        limit - 1 - self.gen.next_of(rng, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_ycsb_and_names_are_short() {
        // FNV-1a-64 of eight zero bytes, sign bit cleared.
        let mut h: u64 = 0xCBF2_9CE4_8422_2325;
        for _ in 0..8 {
            h = h.wrapping_mul(0x100000001B3);
        }
        assert_eq!(fnvhash64(0), h & (i64::MAX as u64));
        let mut k = Vec::new();
        key_name(12345, &mut k);
        assert!(k.starts_with(b"user") && k.len() <= 23, "{}", String::from_utf8_lossy(&k));
        let mut d = Vec::new();
        push_u64(&mut d, 0);
        push_u64(&mut d, u64::MAX);
        assert_eq!(d, b"018446744073709551615");
    }

    #[test]
    fn zipfian_is_skewed_towards_item_zero_and_in_range() {
        let mut rng = Rng::new(1);
        let mut z = Zipfian::new(1000, ZIPFIAN_THETA);
        let mut counts = vec![0u32; 1000];
        for _ in 0..200_000 {
            counts[z.next(&mut rng) as usize] += 1;
        }
        // P(0) = 1 / zeta(1000, 0.99), about 0.133.
        let p0 = counts[0] as f64 / 200_000.0;
        assert!((p0 - 0.133).abs() < 0.01, "{p0}");
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
    }

    #[test]
    fn incremental_zeta_equals_direct() {
        let mut rng = Rng::new(3);
        let mut z = Zipfian::new(100, ZIPFIAN_THETA);
        let _ = z.next_of(&mut rng, 5000);
        let direct = Zipfian::new(5000, ZIPFIAN_THETA);
        assert!((z.zetan - direct.zetan).abs() < 1e-9);
        assert!((z.eta - direct.eta).abs() < 1e-9);
    }

    #[test]
    fn scrambled_zipfian_spreads_hot_keys_with_ycsbs_skew() {
        let mut rng = Rng::new(7);
        let n = 100_000u64;
        let mut z = ScrambledZipfian::new(n);
        let mut counts = std::collections::HashMap::new();
        let draws = 400_000;
        for _ in 0..draws {
            let k = z.next(&mut rng);
            assert!(k < n);
            *counts.entry(k).or_insert(0u32) += 1;
        }
        // The hottest item over 10^10 has probability 1 / 26.47, about 3.8%.
        let max = *counts.values().max().unwrap() as f64 / draws as f64;
        assert!((0.03..0.05).contains(&max), "{max}");
        // Hot keys are not clustered at the start of the key space.
        let mut hot: Vec<(u64, u32)> = counts.into_iter().collect();
        hot.sort_by_key(|b| std::cmp::Reverse(b.1));
        assert!(hot[..10].iter().any(|(k, _)| *k > n / 2));
    }

    #[test]
    fn latest_reads_recent_acknowledged_keys() {
        let w = AckWindow::new(1000);
        let a = w.allocate();
        let b = w.allocate();
        assert_eq!((a, b), (1000, 1001));
        w.acknowledge(b);
        assert_eq!(w.limit(), 1000, "1000 is not acknowledged yet");
        w.acknowledge(a);
        assert_eq!(w.limit(), 1002);
        let mut rng = Rng::new(9);
        let mut l = Latest::new(1000);
        let mut recent = 0;
        for _ in 0..10_000 {
            let k = l.next(&mut rng, &w);
            assert!(k < 1002);
            if k >= 1002 - 10 {
                recent += 1;
            }
        }
        assert!(recent > 3000, "{recent}");
    }

    #[test]
    fn rng_below_is_in_range() {
        let mut r = Rng::new(0);
        for n in [1u64, 2, 7, 1 << 40] {
            for _ in 0..1000 {
                assert!(r.below(n) < n);
            }
        }
    }
}
