//! YCSB's zipfian generator (Gray et al., "Quickly generating billion-record synthetic
//! databases"), scrambled with FNV-1a as YCSB's `ScrambledZipfianGenerator` does, so that the
//! hot keys are spread over the key space rather than clustered at its start.

pub struct Zipf {
    items: u64,
    theta: f64,
    zetan: f64,
    alpha: f64,
    eta: f64,
    state: u64,
}

fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

impl Zipf {
    pub fn new(items: u64, theta: f64, seed: u64) -> Zipf {
        let zetan = zeta(items, theta);
        let zeta2 = zeta(2, theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipf { items, theta, zetan, alpha, eta, state: seed | 1 }
    }

    fn uniform(&mut self) -> f64 {
        // xorshift64*: fast, and good enough to draw ranks.
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        (self.state.wrapping_mul(0x2545F4914F6CDD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next item, in `0..items`.
    pub fn next_item(&mut self) -> u64 {
        let u = self.uniform();
        let uz = u * self.zetan;
        let rank = if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(self.theta) {
            1
        } else {
            ((self.items as f64) * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
        };
        fnv1a(rank.min(self.items - 1)) % self.items
    }
}

fn fnv1a(x: u64) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in x.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[cfg(test)]
mod tests {
    #[test]
    fn skewed_and_in_range() {
        let mut z = super::Zipf::new(100_000, 0.99, 1);
        let mut counts = std::collections::HashMap::new();
        for _ in 0..100_000 {
            let i = z.next_item();
            assert!(i < 100_000);
            *counts.entry(i).or_insert(0u32) += 1;
        }
        let max = *counts.values().max().unwrap();
        // The hottest key of a 0.99 zipfian over 100k keys takes about 8% of draws.
        assert!(max > 4_000 && max < 15_000, "{max}");
    }
}
