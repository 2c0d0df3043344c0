//! Seeded fault injection: the adversary that owns the network.
//!
//! [`FaultInjector`] is a pure state machine (no I/O, no clock of its own: every call is handed
//! `now`), so the same seed and the same input give the same faults, and tests can drive it with
//! a virtual clock. Two drivers use it: [`crate::Adversarial`] around any [`crate::Fabric`]
//! endpoint, and the router's per-link send path (`RouterConfig::faults`).
//!
//! For each message pushed, in this order, each an independent draw:
//! 1. **replay** (`replay`): after this message, also emit a random *earlier* message from a
//!    bounded history (`replay_history` messages, `replay_history_bytes_max` bytes). The history
//!    holds every message pushed, dropped ones included: the adversary saw them.
//! 2. **drop** (`drop`): the message goes no further.
//! 3. **corrupt** (`corrupt`): 1 to 4 distinct random bytes are XORed with a non-zero byte.
//! 4. **duplicate** (`duplicate`): the message is emitted twice.
//! 5. for each copy, **delay** (`delay`, if `delay_ms_max > 0`): held for 1..=`delay_ms_max` ms;
//!    otherwise **reorder** (`reorder`): held until 1..=`reorder_window` later messages have been
//!    pushed (or `reorder_hold_ms_max` has passed, so a held message is never stuck when traffic
//!    stops); otherwise emitted now.
//!
//! All draws for one message come from a per-message generator seeded from the main ChaCha8
//! stream, so the decisions for message *i* depend only on the seed, *i*, and the messages
//! themselves, never on timing. Held messages are bounded (`held_msgs_max`): past it, a message
//! that would be held is emitted at once.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::ConfigError;
use crate::stats::FaultStats;

/// Fault rates (each a probability in `[0, 1]`) and their bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    /// Seed of the fault sequence (default 0).
    pub seed: u64,
    /// Probability a message is lost (default 0).
    pub drop: f64,
    /// Probability a message is sent twice (default 0).
    pub duplicate: f64,
    /// Probability a message is held back behind later ones (default 0).
    pub reorder: f64,
    /// A reordered message is released after 1..=this many later messages (default 8).
    pub reorder_window: u32,
    /// ...or after this long, whichever is first (default 100 ms).
    pub reorder_hold_ms_max: u64,
    /// Probability a message is delayed (default 0; needs `delay_ms_max > 0`).
    pub delay: f64,
    /// A delayed message is held 1..=this many ms (default 0).
    pub delay_ms_max: u64,
    /// Probability 1..4 bytes of a message are flipped (default 0).
    pub corrupt: f64,
    /// Probability an earlier message is sent again after this one (default 0).
    pub replay: f64,
    /// Messages remembered for replay (default 1024)...
    pub replay_history: usize,
    /// ...and at most this many bytes of them (default 16 MiB).
    pub replay_history_bytes_max: usize,
    /// Most messages held back at once by delay and reorder (default 4096).
    pub held_msgs_max: usize,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            seed: 0,
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_window: 8,
            reorder_hold_ms_max: 100,
            delay: 0.0,
            delay_ms_max: 0,
            corrupt: 0.0,
            replay: 0.0,
            replay_history: 1024,
            replay_history_bytes_max: 16 << 20,
            held_msgs_max: 4096,
        }
    }
}

impl FaultConfig {
    /// Checks every rate is in `[0, 1]` and the bounds can work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, p) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("delay", self.delay),
            ("corrupt", self.corrupt),
            ("replay", self.replay),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(ConfigError::new(field, format!("rate {p} is not in [0, 1]")));
            }
        }
        if self.reorder > 0.0 && self.reorder_window == 0 {
            return Err(ConfigError::new("reorder_window", "must be at least 1 when reorder > 0"));
        }
        if self.replay > 0.0 && (self.replay_history == 0 || self.replay_history_bytes_max == 0) {
            return Err(ConfigError::new("replay_history", "must be at least 1 when replay > 0"));
        }
        Ok(())
    }

    /// True when every rate is 0: the injector passes messages through unchanged, in order.
    pub fn is_transparent(&self) -> bool {
        [self.drop, self.duplicate, self.reorder, self.delay, self.corrupt, self.replay].iter().all(|p| *p == 0.0)
    }

    /// True when some message may be held back (so a driver needs a timer).
    pub fn may_hold(&self) -> bool {
        self.reorder > 0.0 || (self.delay > 0.0 && self.delay_ms_max > 0)
    }

    /// The same rates with a seed derived from this one and `stream` (one per router link, one
    /// per side of an endpoint), so independent streams do not repeat each other's faults.
    pub fn for_stream(&self, stream: u64) -> FaultConfig {
        FaultConfig { seed: splitmix64(self.seed ^ splitmix64(stream.wrapping_add(0x5053_4c46))), ..self.clone() }
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Debug)]
struct Held {
    msg: Bytes,
    due: Instant,
    /// For a reordered message: (messages pushed when it was held, how many later ones to wait).
    after: Option<(u64, u64)>,
    seq: u64,
}

/// The fault state machine. See the module doc for the rules.
#[derive(Debug)]
pub struct FaultInjector {
    cfg: FaultConfig,
    rng: ChaCha8Rng,
    held: Vec<Held>,
    hold_seq: u64,
    history: VecDeque<Bytes>,
    history_bytes: usize,
    stats: FaultStats,
}

#[inline]
fn roll(r: &mut ChaCha8Rng, p: f64) -> bool {
    r.random::<f64>() < p
}

impl FaultInjector {
    /// An injector for `cfg` (validated).
    pub fn new(cfg: FaultConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(FaultInjector {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            held: Vec::new(),
            hold_seq: 0,
            history: VecDeque::new(),
            history_bytes: 0,
            stats: FaultStats::default(),
        })
    }

    /// The configuration (rates, bounds, seed) this injector runs with.
    pub fn config(&self) -> &FaultConfig {
        &self.cfg
    }

    /// Faults injected so far.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    /// Messages currently held back.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// When the earliest held message is due, if any: call [`FaultInjector::poll`] then.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.held.iter().map(|h| h.due).min()
    }

    /// Pushes one message through the adversary at time `now`; whatever it lets through now
    /// (this message, copies, replays, earlier held messages now due) is appended to `out`.
    pub fn push<O: Extend<Bytes>>(&mut self, msg: Bytes, now: Instant, out: &mut O) {
        self.stats.messages += 1;
        let mut r = ChaCha8Rng::seed_from_u64(self.rng.next_u64());
        let replay = if roll(&mut r, self.cfg.replay) && !self.history.is_empty() {
            let i = r.random_range(0..self.history.len());
            Some(self.history[i].clone())
        } else {
            None
        };
        if self.cfg.replay > 0.0 {
            self.remember(msg.clone());
        }
        if roll(&mut r, self.cfg.drop) {
            self.stats.dropped += 1;
        } else {
            let msg = if roll(&mut r, self.cfg.corrupt) && !msg.is_empty() {
                self.stats.corrupted += 1;
                corrupt(&mut r, &msg)
            } else {
                msg
            };
            if roll(&mut r, self.cfg.duplicate) {
                self.stats.duplicated += 1;
                self.route(&mut r, msg.clone(), now, out);
            }
            self.route(&mut r, msg, now, out);
        }
        if let Some(m) = replay {
            self.stats.replayed += 1;
            out.extend(Some(m));
        }
        // Reordered messages whose count of later messages is reached.
        let pushed = self.stats.messages;
        out.extend(self.held.extract_if(.., |h| h.after.is_some_and(|(at, k)| pushed - at >= k)).map(|h| h.msg));
        self.poll(now, out);
    }

    /// Releases every held message due at `now`, earliest first.
    pub fn poll<O: Extend<Bytes>>(&mut self, now: Instant, out: &mut O) {
        if self.held.iter().all(|h| h.due > now) {
            return;
        }
        let mut due: Vec<Held> = self.held.extract_if(.., |h| h.due <= now).collect();
        due.sort_by_key(|h| (h.due, h.seq));
        out.extend(due.into_iter().map(|h| h.msg));
    }

    /// Releases every held message now, in the order they were held (for a clean shutdown).
    pub fn flush<O: Extend<Bytes>>(&mut self, out: &mut O) {
        out.extend(self.held.drain(..).map(|h| h.msg));
    }

    fn route<O: Extend<Bytes>>(&mut self, r: &mut ChaCha8Rng, msg: Bytes, now: Instant, out: &mut O) {
        let cfg = &self.cfg;
        let hold = if roll(r, cfg.delay) && cfg.delay_ms_max > 0 {
            let ms = r.random_range(1..=cfg.delay_ms_max);
            Some((now + Duration::from_millis(ms), None))
        } else if roll(r, cfg.reorder) {
            let k = r.random_range(1..=u64::from(cfg.reorder_window.max(1)));
            Some((now + Duration::from_millis(cfg.reorder_hold_ms_max), Some((self.stats.messages, k))))
        } else {
            None
        };
        match hold {
            Some((due, after)) if self.held.len() < self.cfg.held_msgs_max => {
                if after.is_some() {
                    self.stats.reordered += 1;
                } else {
                    self.stats.delayed += 1;
                }
                self.hold_seq += 1;
                self.held.push(Held { msg, due, after, seq: self.hold_seq });
            }
            _ => out.extend(Some(msg)),
        }
    }

    fn remember(&mut self, msg: Bytes) {
        self.history_bytes += msg.len();
        self.history.push_back(msg);
        while self.history.len() > self.cfg.replay_history
            || (self.history_bytes > self.cfg.replay_history_bytes_max && self.history.len() > 1)
        {
            let old = self.history.pop_front().expect("non-empty");
            self.history_bytes -= old.len();
        }
    }
}

/// XORs 1..=4 distinct random bytes of `msg` (non-empty) with non-zero values.
fn corrupt(r: &mut ChaCha8Rng, msg: &Bytes) -> Bytes {
    let mut v = msg.to_vec();
    let n = r.random_range(1..=4usize).min(v.len());
    for i in rand::seq::index::sample(r, v.len(), n) {
        v[i] ^= r.random_range(1..=255u8);
    }
    Bytes::from(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(n: u32) -> Vec<Bytes> {
        (0..n).map(|i| Bytes::from(i.to_le_bytes().to_vec())).collect()
    }

    #[test]
    fn rates_outside_unit_interval_are_refused() {
        for bad in [-0.1, 1.5, f64::NAN] {
            let e = FaultInjector::new(FaultConfig { corrupt: bad, ..Default::default() }).unwrap_err();
            assert_eq!(e.field, "corrupt");
        }
    }

    #[test]
    fn reordered_message_is_released_after_its_window_or_its_time() {
        let t0 = Instant::now();
        let cfg = FaultConfig { reorder: 1.0, reorder_window: 1, reorder_hold_ms_max: 50, ..Default::default() };
        let mut inj = FaultInjector::new(cfg).unwrap();
        let mut out = Vec::new();
        inj.push(Bytes::from_static(b"a"), t0, &mut out);
        assert!(out.is_empty());
        assert_eq!(inj.next_deadline(), Some(t0 + Duration::from_millis(50)));
        // "b" is held too (rate 1), and releases "a" (window 1).
        inj.push(Bytes::from_static(b"b"), t0, &mut out);
        assert_eq!(out, vec![Bytes::from_static(b"a")]);
        inj.poll(t0 + Duration::from_millis(49), &mut out);
        assert_eq!(out.len(), 1);
        inj.poll(t0 + Duration::from_millis(50), &mut out);
        assert_eq!(out, vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        assert_eq!(inj.held(), 0);
    }

    #[test]
    fn corruption_changes_one_to_four_bytes() {
        let cfg = FaultConfig { corrupt: 1.0, seed: 3, ..Default::default() };
        let mut inj = FaultInjector::new(cfg).unwrap();
        let t0 = Instant::now();
        for m in msgs(500) {
            let mut out = Vec::new();
            inj.push(m.clone(), t0, &mut out);
            assert_eq!(out.len(), 1);
            let diff = m.iter().zip(out[0].iter()).filter(|(a, b)| a != b).count();
            assert!((1..=4).contains(&diff), "{diff} bytes differ");
        }
    }

    #[test]
    fn held_messages_are_bounded() {
        let cfg = FaultConfig { delay: 1.0, delay_ms_max: 1000, held_msgs_max: 10, ..Default::default() };
        let mut inj = FaultInjector::new(cfg).unwrap();
        let t0 = Instant::now();
        let mut out = Vec::new();
        for m in msgs(100) {
            inj.push(m, t0, &mut out);
        }
        assert_eq!(inj.held(), 10);
        assert_eq!(out.len(), 90);
        inj.flush(&mut out);
        assert_eq!(out.len(), 100);
    }

    #[test]
    fn replay_history_is_bounded_by_count_and_bytes() {
        let cfg = FaultConfig { replay: 1.0, replay_history: 4, ..Default::default() };
        let mut inj = FaultInjector::new(cfg).unwrap();
        let t0 = Instant::now();
        let mut out = Vec::new();
        for m in msgs(50) {
            inj.push(m, t0, &mut out);
        }
        assert_eq!(inj.history.len(), 4);
        let cfg = FaultConfig { replay: 1.0, replay_history_bytes_max: 10, ..Default::default() };
        let mut inj = FaultInjector::new(cfg).unwrap();
        for m in msgs(50) {
            inj.push(m, t0, &mut out);
        }
        assert!(inj.history_bytes <= 10);
        // First message has nothing earlier to replay.
        assert_eq!(inj.stats().replayed, 49);
    }

    #[test]
    fn stream_seeds_differ() {
        let c = FaultConfig { seed: 7, ..Default::default() };
        assert_ne!(c.for_stream(1).seed, c.for_stream(2).seed);
        assert_eq!(c.for_stream(1).seed, c.for_stream(1).seed);
    }
}
