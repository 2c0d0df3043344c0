//! The simulated network: every publish is delivered to every other endpoint through the fault
//! model. Endpoints are indices; a partition assigns each a side.

use crate::config::SimConfig;
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::BTreeMap;

/// Counters of what the network did over a run (in messages), for the report.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct NetStats {
    /// Messages handed to the network: publishes and the adversary's direct sends.
    pub sent: u64,
    /// Copies delivered to an endpoint (whether or not it was up to take them).
    pub delivered: u64,
    /// Copies lost to the loss rate (one per receiver of a publish).
    pub dropped: u64,
    /// Copies sent twice to a receiver.
    pub duplicated: u64,
    /// Copies whose bits were flipped on the way.
    pub corrupted: u64,
    /// Old messages delivered again to a random endpoint.
    pub replayed: u64,
    /// Copies not delivered because sender and receiver were on different sides of a partition.
    pub partitioned: u64,
}

/// The simulated network: a queue of copies ordered by delivery time, the recent messages an
/// attacker could replay, and the current partition.
#[derive(Debug)]
pub struct Net {
    /// (deliver_at, sequence) -> (to, bytes); the sequence keeps order deterministic.
    queue: BTreeMap<(u64, u64), (usize, Vec<u8>)>,
    seq: u64,
    history: Vec<Vec<u8>>,
    /// Per endpoint, its side of the current partition (0 or 1; all 0 when there is none).
    pub side: Vec<u8>,
    /// When the current partition heals.
    heal_at: Option<u64>,
    /// What the network did so far.
    pub stats: NetStats,
}

/// The fault model applied to each message: the run's rates while the workload runs, calm
/// ones while it settles.
pub struct Faults {
    /// Per delivery: probability that the copy is dropped.
    pub loss: f64,
    /// Per delivery: probability that the receiver gets two copies.
    pub duplicate: f64,
    /// Largest extra delay in ms (uniform over 0..=max, after the 1 ms minimum); reorders.
    pub delay_ms_max: u64,
    /// Per copy: probability that 1 to 3 bits are flipped.
    pub corrupt: f64,
    /// Per publish: probability that an old message is delivered again to a random endpoint.
    pub replay: f64,
}

const HISTORY_MAX: usize = 4096;

impl Faults {
    /// The run's faults (while the workload runs).
    pub fn of(cfg: &SimConfig) -> Faults {
        Faults {
            loss: cfg.loss,
            duplicate: cfg.duplicate,
            delay_ms_max: cfg.delay_ms_max,
            corrupt: cfg.corrupt,
            replay: cfg.replay,
        }
    }

    /// No faults, short delays (while the run settles).
    pub fn calm() -> Faults {
        Faults { loss: 0.0, duplicate: 0.0, delay_ms_max: 2, corrupt: 0.0, replay: 0.0 }
    }
}

impl Net {
    /// A network of `endpoints` endpoints (nodes, coordinators, then servers), unpartitioned
    /// and empty.
    pub fn new(endpoints: usize) -> Net {
        Net {
            queue: BTreeMap::new(),
            seq: 0,
            history: Vec::new(),
            side: vec![0; endpoints],
            heal_at: None,
            stats: NetStats::default(),
        }
    }

    fn push(&mut self, at: u64, to: usize, bytes: Vec<u8>) {
        self.seq += 1;
        self.queue.insert((at, self.seq), (to, bytes));
    }

    /// `from` publishes `bytes` at `now` to every other of the first `endpoints` endpoints,
    /// each copy through the fault model `f`; the message joins the replay history.
    pub fn publish(&mut self, rng: &mut StdRng, f: &Faults, now: u64, from: usize, bytes: &[u8], endpoints: usize) {
        self.stats.sent += 1;
        if self.history.len() < HISTORY_MAX {
            self.history.push(bytes.to_vec());
        } else {
            let i = rng.random_range(0..HISTORY_MAX);
            self.history[i] = bytes.to_vec();
        }
        for to in 0..endpoints {
            if to == from {
                continue;
            }
            if self.side[to] != self.side[from] {
                self.stats.partitioned += 1;
                continue;
            }
            if rng.random_bool(f.loss) {
                self.stats.dropped += 1;
                continue;
            }
            let copies = if rng.random_bool(f.duplicate) {
                self.stats.duplicated += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                let mut b = bytes.to_vec();
                if !b.is_empty() && rng.random_bool(f.corrupt) {
                    self.stats.corrupted += 1;
                    for _ in 0..rng.random_range(1..=3) {
                        let i = rng.random_range(0..b.len());
                        b[i] ^= 1 << rng.random_range(0..8);
                    }
                }
                let at = now + 1 + rng.random_range(0..=f.delay_ms_max);
                self.push(at, to, b);
            }
        }
        if !self.history.is_empty() && rng.random_bool(f.replay) {
            self.stats.replayed += 1;
            let old = self.history[rng.random_range(0..self.history.len())].clone();
            let to = rng.random_range(0..endpoints);
            let at = now + 1 + rng.random_range(0..=f.delay_ms_max);
            self.push(at, to, old);
        }
    }

    /// One message to one endpoint (an adversary's direct send), with the link's loss, delay and
    /// partition, but kept out of the replay history.
    pub fn send_to(&mut self, rng: &mut StdRng, f: &Faults, now: u64, to: usize, bytes: &[u8]) {
        self.stats.sent += 1;
        if rng.random_bool(f.loss) {
            self.stats.dropped += 1;
            return;
        }
        let at = now + 1 + rng.random_range(0..=f.delay_ms_max);
        self.push(at, to, bytes.to_vec());
    }

    /// Messages due at or before `now`, in delivery order.
    pub fn due(&mut self, now: u64) -> Vec<(usize, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(((at, _), _)) = self.queue.first_key_value() {
            if *at > now {
                break;
            }
            let (_, m) = self.queue.pop_first().expect("non-empty");
            out.push(m);
        }
        self.stats.delivered += out.len() as u64;
        out
    }

    /// With probability `p`, unless one is on, a partition splits the endpoints in two at
    /// random until `heal_at`. Returns whether it did.
    pub fn maybe_partition(&mut self, rng: &mut StdRng, p: f64, heal_at: u64) -> bool {
        if self.heal_at.is_some() || !rng.random_bool(p) {
            return false;
        }
        for s in self.side.iter_mut() {
            *s = rng.random_range(0..2);
        }
        self.heal_at = Some(heal_at);
        true
    }

    /// The partition heals when due, or at once when `force` (faults have stopped).
    pub fn heal(&mut self, now: u64, force: bool) {
        if self.heal_at.is_some_and(|t| now >= t || force) {
            self.side.iter_mut().for_each(|s| *s = 0);
            self.heal_at = None;
        }
    }

    /// Copies queued and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}
